// mfattn sweep, part 3: running the cases. Each case is a child process of the same binary
// (`/proc/self/exe run ... --out DIR/<id>.h5.part --quiet --overwrite`), guarded by an
// open-file-description lock on DIR/<id>.lock that the child inherits, renamed to DIR/<id>.h5
// when it ends; --jobs children at once; shards and MPI ranks split the grid.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#ifdef MFATTN_HAVE_MPI
#define OMPI_SKIP_MPICXX 1   // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include "mfattn/h5md.hpp"
#include "mfattn/run.hpp"
#include "mfattn/sweep.hpp"

extern char** environ;

namespace mfattn {
namespace fs = std::filesystem;

namespace {

fs::path lock_path(const std::string& dir, const std::string& id) { return fs::path(dir) / (id + ".lock"); }

/// An exclusive open-file-description lock (F_OFD_SETLK) on DIR/<id>.lock. It belongs to the
/// open file, not the process: the case's child inherits it, and it goes away when the last
/// holder exits, however it exits (a SIGKILLed sweep leaves no stale lock).
class CaseLock {
 public:
  /// nullptr when another process holds the lock. Throws IoError.
  static std::unique_ptr<CaseLock> acquire(const fs::path& path) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) throw IoError("cannot create " + path.string() + ": " + std::strerror(errno));
      struct flock lock {};
      lock.l_type = F_WRLCK;
      lock.l_whence = SEEK_SET;
      if (::fcntl(fd, F_OFD_SETLK, &lock) != 0) {
        const int error = errno;
        ::close(fd);
        if (error == EAGAIN || error == EACCES) return nullptr;
        throw IoError("cannot lock " + path.string() + ": " + std::strerror(error));
      }
      // A holder that finished unlinks the file before it lets go: if the name no longer
      // points at the file we locked, lock the new one.
      struct stat held {}, named {};
      if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
          held.st_dev == named.st_dev)
        return std::unique_ptr<CaseLock>(new CaseLock(path, fd));
      ::close(fd);
    }
    throw IoError("cannot lock " + path.string() + ": it keeps being replaced");
  }
  ~CaseLock() {
    std::error_code ignored;
    fs::remove(path_, ignored);
    ::close(fd_);
  }
  CaseLock(const CaseLock&) = delete;
  CaseLock& operator=(const CaseLock&) = delete;
  int fd() const { return fd_; }

 private:
  CaseLock(fs::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  fs::path path_;
  int fd_;
};

bool is_complete(const fs::path& file) {
  std::error_code ignored;
  if (!fs::exists(file, ignored)) return false;
  try {
    for (const auto& [key, value] : describe_file(file.string()).run)
      if (key == "status") return value == "complete";
  } catch (const IoError&) {
  }
  return false;
}

/// MPI when the process was started by an MPI launcher (or MFATTN_SWEEP_MPI=1); otherwise,
/// and in builds without MPI, one process of rank 0.
class Communicator {
 public:
  Communicator() {
#ifdef MFATTN_HAVE_MPI
    if (wanted()) {
      int initialized = 0;
      MPI_Initialized(&initialized);
      if (!initialized) {
        MPI_Init(nullptr, nullptr);
        owns_ = true;
      }
      active_ = true;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &size_);
      MPI_Comm local;
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
      MPI_Comm_size(local, &local_size_);
      MPI_Comm_free(&local);
    }
#endif
  }
  ~Communicator() {
#ifdef MFATTN_HAVE_MPI
    if (owns_) MPI_Finalize();
#endif
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_size() const { return local_size_; }
  void barrier() const {
#ifdef MFATTN_HAVE_MPI
    if (active_) MPI_Barrier(MPI_COMM_WORLD);
#endif
  }
  int max(int value) const {
#ifdef MFATTN_HAVE_MPI
    if (active_) {
      int result = value;
      MPI_Allreduce(&value, &result, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      return result;
    }
#endif
    return value;
  }

 private:
#ifdef MFATTN_HAVE_MPI
  static bool wanted() {
    if (const char* forced = std::getenv("MFATTN_SWEEP_MPI"); forced && *forced)
      return std::string(forced) != "0";
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS",
                             "MV2_COMM_WORLD_SIZE"})
      if (std::getenv(name)) return true;
    return false;
  }
  bool active_ = false, owns_ = false;
#endif
  int rank_ = 0, size_ = 1, local_size_ = 1;
};

/// The cores this process may use: OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK, else its CPU
/// affinity (shared with the other ranks on this node when the launcher did not bind them).
int available_cores(int local_ranks) {
  for (const char* name : {"OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"})
    if (const char* value = std::getenv(name); value && std::atoi(value) > 0) return std::atoi(value);
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = 1;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (local_ranks > 1 && online > 0 && cores >= online) cores /= local_ranks;
  return std::max(1, cores);
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  const int code = WEXITSTATUS(status);
  std::string text = "exit code " + std::to_string(code);
  if (code == kExitUsage) text += " (usage error)";
  if (code == kExitNumerical) text += " (numerical failure)";
  if (code == kExitIo) text += " (I/O failure)";
  return text;
}

std::string format_seconds(double seconds) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(seconds < 10 ? 2 : 1) << seconds << " s";
  return out.str();
}

/// One case in flight.
struct Child {
  const SweepCase* c = nullptr;
  pid_t pid = -1;
  int pidfd = -1;
  bool resuming = false;
  std::unique_ptr<CaseLock> lock;
  std::chrono::steady_clock::time_point start;
};

class Runner {
 public:
  Runner(const SweepPlan& plan, const SweepOptions& options, int threads, std::string prefix, std::ostream& out)
      : plan_(plan), options_(options), threads_(threads), prefix_(std::move(prefix)), out_(out) {
    reserved_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  ~Runner() {
    if (reserved_fd_ >= 0) ::close(reserved_fd_);
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  /// Runs the given cases, `jobs` at a time; returns the worst exit code.
  int run(const std::vector<std::size_t>& mine) {
    std::vector<Child> running;
    std::size_t next = 0;
    while (next < mine.size() || !running.empty()) {
      while (next < mine.size() && running.size() < static_cast<std::size_t>(options_.jobs)) {
        const SweepCase& c = plan_.cases[mine[next++]];
        try {
          if (auto child = start(c)) running.push_back(std::move(*child));
        } catch (const IoError& e) {
          say("failed " + c.id + ": " + e.what());
          ++failed_;
          worst(kExitIo);
        }
      }
      if (running.empty()) continue;
      const std::size_t done = wait_any(running);
      Child child = std::move(running[done]);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(done));
      int status = 0;
      ::waitpid(child.pid, &status, 0);
      if (child.pidfd >= 0) ::close(child.pidfd);
      try {
        if (auto again = finish(std::move(child), status)) running.push_back(std::move(*again));
      } catch (const IoError& e) {
        say(std::string("failed: ") + e.what());
        ++failed_;
        worst(kExitIo);
      }
    }
    return code_;
  }

  std::size_t ran() const { return ran_; }
  std::size_t skipped_complete() const { return skipped_complete_; }
  std::size_t skipped_running() const { return skipped_running_; }
  std::size_t failed() const { return failed_; }

 private:
  void say(const std::string& line) { out_ << prefix_ << line << std::endl; }
  void worst(int code) {
    // Usage errors first, then I/O failures, then numerical failures.
    auto rank = [](int c) { return c == kExitUsage ? 3 : c == kExitIo ? 2 : c == kExitNumerical ? 1 : 0; };
    if (rank(code) > rank(code_)) code_ = code;
  }

  fs::path file(const SweepCase& c, const std::string& suffix) const {
    return fs::path(options_.out_dir) / (c.id + suffix);
  }

  std::string label(const SweepCase& c) const {
    std::string text = "(case " + std::to_string(c.index) + " of " + std::to_string(plan_.cases.size());
    for (std::size_t a = 0; a < plan_.axes.size(); ++a)
      text += (a ? " " : ": ") + plan_.axes[a].name + "=" + c.values[a];
    return text + ")";
  }

  /// Skips a done or locked case, else starts it.
  std::optional<Child> start(const SweepCase& c) {
    const fs::path final_file = file(c, ".h5");
    if (is_complete(final_file)) {
      say("skip " + c.id + " complete " + label(c));
      ++skipped_complete_;
      return std::nullopt;
    }
    auto lock = CaseLock::acquire(lock_path(options_.out_dir, c.id));
    if (!lock) {
      say("skip " + c.id + " running elsewhere " + label(c));
      ++skipped_running_;
      return std::nullopt;
    }
    if (is_complete(final_file)) {  // finished by another process since the first look
      say("skip " + c.id + " complete " + label(c));
      ++skipped_complete_;
      return std::nullopt;
    }
    const fs::path part = file(c, ".h5.part");
    bool resuming = false;
    std::error_code error;
    if (fs::exists(part, error)) {
      resuming = options_.resume && is_mfattn_file(part.string());
      if (!resuming) remove_file(part);
    }
    Child child;
    child.c = &c;
    child.lock = std::move(lock);
    child.resuming = resuming;
    spawn(child);
    say(std::string(resuming ? "resume " : "run ") + c.id + " " + label(c));
    return child;
  }

  static void remove_file(const fs::path& path) {
    std::error_code error;
    fs::remove(path, error);
    if (error) throw IoError("cannot remove " + path.string() + ": " + error.message());
  }

  void spawn(Child& child) {
    const SweepCase& c = *child.c;
    std::vector<std::string> args = {"mfattn", "run"};
    args.insert(args.end(), c.arguments.begin(), c.arguments.end());
    args.insert(args.end(), {"--out", file(c, ".h5.part").string(), "--quiet",
                             child.resuming ? "--resume" : "--overwrite"});
    if (!plan_.sets_threads) args.insert(args.end(), {"--threads", std::to_string(threads_)});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = file(c, ".log").string();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
    // The child keeps the case lock open (dup2 clears close-on-exec on the copy) until it ends.
    if (reserved_fd_ >= 0) posix_spawn_file_actions_adddup2(&actions, child.lock->fd(), reserved_fd_);
    pid_t pid = -1;
    const int error = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) throw IoError("cannot start mfattn run for case " + c.id + ": " + std::strerror(error));
    child.pid = pid;
#ifdef SYS_pidfd_open
    child.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
    child.start = std::chrono::steady_clock::now();
  }

  /// Index of a child that has ended (not yet reaped).
  static std::size_t wait_any(const std::vector<Child>& running) {
    for (;;) {
      for (std::size_t i = 0; i < running.size(); ++i) {
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(running[i].pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            info.si_pid == running[i].pid)
          return i;
      }
      const bool pollable = std::all_of(running.begin(), running.end(), [](const Child& c) { return c.pidfd >= 0; });
      if (pollable) {
        std::vector<pollfd> fds;
        for (const auto& c : running) fds.push_back({c.pidfd, POLLIN, 0});
        ::poll(fds.data(), fds.size(), 1000);
      } else {
        ::usleep(2000);
      }
    }
  }

  /// Handles an ended child: rename, log and report; a refused --resume restarts the case.
  std::optional<Child> finish(Child child, int status) {
    const SweepCase& c = *child.c;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - child.start).count();
    const fs::path part = file(c, ".h5.part"), final_file = file(c, ".h5");
    const bool exited = WIFEXITED(status);
    const int code = exited ? WEXITSTATUS(status) : -1;
    if (code == kExitOk || code == kExitNumerical) {
      std::error_code error;
      fs::rename(part, final_file, error);
      if (error) throw IoError("case " + c.id + ": cannot rename " + part.string() + ": " + error.message());
    }
    if (code == kExitOk) {
      say("done " + c.id + " complete in " + format_seconds(seconds));
      ++ran_;
      return std::nullopt;  // the lock goes with `child`
    }
    if (code == kExitUsage && child.resuming) {
      say("restart " + c.id + ": its interrupted file cannot be resumed (see " + file(c, ".log").string() + ")");
      remove_file(part);
      child.resuming = false;
      spawn(child);
      return child;
    }
    const std::string reason = describe_exit(status);
    std::ofstream(file(c, ".log"), std::ios::app) << "mfattn sweep: " << reason << '\n';
    // A killed case keeps its .part (the next sweep restarts it, or continues it with
    // --resume); a refused one leaves nothing.
    if (exited && code != kExitNumerical) {
      std::error_code ignored;
      fs::remove(part, ignored);
    }
    say("failed " + c.id + " " + reason + " in " + format_seconds(seconds) + ", see " + file(c, ".log").string());
    ++ran_;
    ++failed_;
    worst(exited && code != 0 ? (code == kExitUsage || code == kExitNumerical ? code : kExitIo) : kExitIo);
    return std::nullopt;
  }

  const SweepPlan& plan_;
  const SweepOptions& options_;
  int threads_;
  std::string prefix_;
  std::ostream& out_;
  int reserved_fd_ = -1;
  int code_ = kExitOk;
  std::size_t ran_ = 0, skipped_complete_ = 0, skipped_running_ = 0, failed_ = 0;
};

}  // namespace

bool case_locked(const std::string& dir, const std::string& id) {
  const fs::path path = lock_path(dir, id);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  const bool held = ::fcntl(fd, F_OFD_GETLK, &probe) == 0 && probe.l_type != F_UNLCK;
  ::close(fd);
  return held;
}

bool sweep_built_with_mpi() {
#ifdef MFATTN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int sweep_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const auto begin = std::chrono::steady_clock::now();
  Communicator comm;
  const std::string prefix =
      comm.size() > 1 ? "mfattn sweep[rank " + std::to_string(comm.rank()) + "]: " : "mfattn sweep: ";
  // Every rank takes the same path through the collectives below; only rank 0 reports
  // problems that every rank sees alike.
  SweepOptions options;
  SweepPlan plan;
  try {
    options = parse_sweep_arguments(args);
    SweepCountHook counted;
    if (options.dry_run)
      // The count first: expanding and checking a large grid takes a while.
      counted = [&](const SweepPlan&, std::size_t total) {
        const Shard shard = options.shard.value_or(Shard{});
        out << prefix << total << (total == 1 ? " case, " : " cases, ")
            << assigned_count(total, shard, comm.rank(), comm.size()) << " in this share";
        if (options.shard) out << " (shard " << shard.index << "/" << shard.count << ")";
        out << " (dry run: nothing is written)" << std::endl;
      };
    plan = load_sweep(options.config, counted);
  } catch (const UsageError& e) {
    if (comm.rank() == 0) err << "mfattn sweep: " << e.what() << std::endl;
    return kExitUsage;
  }
  const Shard shard = options.shard.value_or(Shard{});
  const auto mine = assigned_cases(plan.cases.size(), shard, comm.rank(), comm.size());

  if (options.dry_run) {
    for (const std::size_t index : mine) {
      const SweepCase& c = plan.cases[index];
      out << index << ' ' << c.id << ' ' << case_status(options.out_dir, c.id).text;
      for (std::size_t a = 0; a < plan.axes.size(); ++a) out << ' ' << plan.axes[a].name << '=' << c.values[a];
      out << '\n';
    }
    out << std::flush;
    return kExitOk;
  }

  int code = kExitOk;
  std::error_code error;
  fs::create_directories(options.out_dir, error);
  if (error) {
    err << prefix << "--out-dir " << options.out_dir << ": cannot create it: " << error.message() << std::endl;
    code = kExitIo;
  }
  const int cores = available_cores(comm.local_size());
  const int threads = std::max(1, cores / options.jobs);
  std::size_t ran = 0, skipped_complete = 0, skipped_running = 0, failed = 0;
  if (code == kExitOk) {
    std::ostringstream start;
    start << plan.cases.size() << " cases, " << mine.size() << " in this share";
    if (options.shard) start << " (shard " << shard.index << "/" << shard.count << ")";
    start << ", --jobs " << options.jobs << ", ";
    if (plan.sets_threads) start << "threads from the sweep file";
    else start << threads << (threads == 1 ? " thread" : " threads") << " per case";
    start << ", into " << options.out_dir;
    out << prefix << start.str() << std::endl;
    Runner runner(plan, options, threads, prefix, out);
    code = runner.run(mine);
    ran = runner.ran();
    skipped_complete = runner.skipped_complete();
    skipped_running = runner.skipped_running();
    failed = runner.failed();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  out << prefix << mine.size() << " cases here: " << ran << " ran, " << skipped_complete
      << " skipped (complete), " << skipped_running << " skipped (running elsewhere), " << failed
      << " failed, in " << format_seconds(seconds) << std::endl;

  comm.barrier();
  if (comm.rank() == 0 && fs::is_directory(options.out_dir, error)) {
    try {
      std::size_t complete = 0, bad = 0, busy = 0, missing = 0;
      for (const auto& status : write_manifest(plan, options.out_dir)) {
        switch (status.state) {
          case CaseStatus::State::Complete: ++complete; break;
          case CaseStatus::State::Failed: ++bad; break;
          case CaseStatus::State::Running: ++busy; break;
          case CaseStatus::State::Missing: ++missing; break;
        }
      }
      out << prefix << "manifest " << (fs::path(options.out_dir) / "manifest.csv").string() << " (and .json): "
          << plan.cases.size() << " cases, " << complete << " complete, " << bad << " failed, " << busy
          << " running, " << missing << " missing" << std::endl;
    } catch (const IoError& e) {
      err << prefix << e.what() << std::endl;
      code = code == kExitOk || code == kExitNumerical ? kExitIo : code;
    }
  }
  const int all = comm.max(code == kExitUsage ? 3 : code == kExitIo ? 2 : code == kExitNumerical ? 1 : 0);
  return all == 3 ? kExitUsage : all == 2 ? kExitIo : all == 1 ? kExitNumerical : kExitOk;
}

}  // namespace mfattn
