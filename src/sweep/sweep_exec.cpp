// mfattn sweep, part 3: running the cases. Each case is a child process of the same binary
// (`/proc/self/exe run ... --out DIR/<id>.h5.part --quiet --overwrite`), guarded by an
// open-file-description lock on DIR/<id>.lock that the child inherits, renamed to DIR/<id>.h5
// when it ends; --jobs children at once; shards and MPI ranks split the grid. Children run in
// their own process groups and die with the sweep (PR_SET_PDEATHSIG); SIGTERM, SIGINT and SIGHUP are
// forwarded to them, and the sweep then reports what is undone and exits 128 + signal.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#ifdef MFATTN_HAVE_MPI
#define OMPI_SKIP_MPICXX 1   // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include "mfattn/io/h5md.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/app/stop_signals.hpp"
#include "mfattn/sweep/sweep.hpp"
#include "io/path_lock.hpp"

extern char** environ;

namespace mfattn {
namespace fs = std::filesystem;

namespace {

fs::path lock_path(const std::string& dir, const std::string& id) { return fs::path(dir) / (id + ".lock"); }

/// A case's lock on DIR/<id>.lock (io/path_lock.hpp): the case's child inherits it, and it
/// goes away when the last holder exits, however it exits (a SIGKILLed sweep leaves no stale
/// lock).
using CaseLock = PathLock;

/// The summary of `file` when it is a complete run (its /run/status), else nothing.
std::optional<FileSummary> complete_run(const fs::path& file) {
  std::error_code ignored;
  if (!fs::exists(file, ignored)) return std::nullopt;
  try {
    FileSummary summary = describe_file(file.string());
    for (const auto& [key, value] : summary.run)
      if (key == "status" && value == "complete") return summary;
  } catch (const IoError&) {
  }
  return std::nullopt;
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

// ---- Signals ---------------------------------------------------------------------------------
// SIGTERM, SIGINT and SIGHUP (mfattn/app/stop_signals.hpp): forwarded to the running cases, then
// the sweep stops. `run` treats each of them alike.

/// Waits up to timeout_ms (-1: for ever) or until a stop signal arrives.
void sleep_or_wake(int timeout_ms) {
  if (const int wake = StopSignals::wake_fd(); wake >= 0) {
    pollfd fd{wake, POLLIN, 0};
    ::poll(&fd, 1, timeout_ms);
    StopSignals::drain_wake();
  } else {
    ::usleep(static_cast<useconds_t>(std::clamp(timeout_ms, 0, 20)) * 1000);
  }
}

/// The signal behind an exit status: the one that killed the process, or N of an exit code
/// 128 + N (how `run` ends after flushing on SIGTERM or SIGINT); 0 for neither.
int ending_signal(int status) {
  if (WIFSIGNALED(status)) return WTERMSIG(status);
  if (WIFEXITED(status) && WEXITSTATUS(status) > 128 && WEXITSTATUS(status) < 128 + 65)
    return WEXITSTATUS(status) - 128;
  return 0;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  const int code = WEXITSTATUS(status);
  std::string text = "exit code " + std::to_string(code);
  if (code == kExitUsage) text += " (usage error)";
  if (code == kExitNumerical) text += " (numerical failure)";
  if (code == kExitIo) text += " (I/O failure)";
  if (const int signal = ending_signal(status)) text += " (interrupted by " + signal_name(signal) + ")";
  return text;
}

/// One case in flight.
struct Child {
  const SweepCase* c = nullptr;
  pid_t pid = -1;
  int pidfd = -1;
  bool resuming = false;
  bool signalled = false;  ///< the sweep forwarded a stop signal to it
  std::unique_ptr<CaseLock> lock;
  std::chrono::steady_clock::time_point start;
};

/// What the cases of this share came to, besides the counts.
struct Undone {
  std::vector<std::string> interrupted;  ///< ids of cases stopped by the sweep's signal
  std::vector<std::string> not_started;  ///< ids of cases the signal kept from starting
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

  /// Runs the given cases, `jobs` at a time; returns the worst exit code. A case that another
  /// process holds is waited for: it is looked at again every 200 ms (while the other cases
  /// run) until its lock is free, then skipped if that process completed it, else run here.
  /// After a stop signal no case starts, the running ones get the signal and are waited for.
  int run(const std::vector<std::size_t>& mine) {
    using Clock = std::chrono::steady_clock;
    constexpr auto kLockPoll = std::chrono::milliseconds(200);
    std::vector<Child> running;
    std::vector<const SweepCase*> waiting;  // locked by another process
    std::size_t next = 0;
    auto next_look = Clock::now() + kLockPoll;
    const auto free_slot = [&] { return running.size() < static_cast<std::size_t>(options_.jobs); };
    for (;;) {
      forward(running);
      const bool stopping = StopSignals::received() != 0;
      if (!stopping) {
        while (free_slot() && next < mine.size() && StopSignals::received() == 0)
          launch(plan_.cases[mine[next++]], running, waiting, false);
        if (free_slot() && !waiting.empty() && Clock::now() >= next_look) {
          std::vector<const SweepCase*> still;
          for (const SweepCase* c : waiting) {
            if (free_slot() && StopSignals::received() == 0) launch(*c, running, still, true);
            else still.push_back(c);
          }
          waiting.swap(still);
          next_look = Clock::now() + kLockPoll;
        }
      }
      if (running.empty() && (stopping || (next >= mine.size() && waiting.empty()))) break;
      int timeout = -1;  // a held case is looked at again only when a slot is free for it
      if (!stopping && !waiting.empty() && free_slot())
        timeout = static_cast<int>(std::clamp<long long>(
            std::chrono::duration_cast<std::chrono::milliseconds>(next_look - Clock::now()).count(), 0, 1000));
      if (running.empty()) {
        sleep_or_wake(timeout);
        continue;
      }
      const auto done = wait_any(running, timeout);
      if (!done) continue;
      Child child = std::move(running[*done]);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(*done));
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
    for (std::size_t k = next; k < mine.size(); ++k) note_not_started(plan_.cases[mine[k]]);
    for (const SweepCase* c : waiting) note_not_started(*c);
    return code_;
  }

  std::size_t ran() const { return ran_; }
  std::size_t skipped_complete() const { return skipped_complete_; }
  std::size_t waited() const { return waited_; }
  std::size_t failed() const { return failed_; }
  /// Cases stopped or kept from starting by a stop signal (the ids of at most kListed of
  /// those not started).
  const Undone& undone() const { return undone_; }
  std::size_t not_started() const { return not_started_; }
  static constexpr std::size_t kListed = 20;

 private:
  void say(const std::string& line) { out_ << prefix_ << line << std::endl; }
  void worst(int code) {
    // Usage errors first, then I/O failures, then numerical failures.
    auto rank = [](int c) { return c == kExitUsage ? 3 : c == kExitIo ? 2 : c == kExitNumerical ? 1 : 0; };
    if (rank(code) > rank(code_)) code_ = code;
  }
  void note_not_started(const SweepCase& c) {
    ++not_started_;
    if (undone_.not_started.size() < kListed) undone_.not_started.push_back(c.id);
  }

  fs::path file(const SweepCase& c, const std::string& suffix) const {
    return fs::path(options_.out_dir) / (c.id + suffix);
  }

  std::string label(const SweepCase& c) const {
    std::string text = "(case " + std::to_string(c.index) + " of " + std::to_string(plan_.cases.size());
    const std::string values = case_values_text(plan_, c, " ");
    if (!values.empty()) text += ": " + values;
    return text + ")";
  }

  /// Sends a stop signal that arrived since the last call to every running case (to its
  /// process group); a second signal sends SIGKILL.
  void forward(std::vector<Child>& running) {
    const int count = StopSignals::count();
    if (count == forwarded_) return;
    const int signal = forwarded_ > 0 ? SIGKILL : StopSignals::received();
    for (auto& child : running) {
      if (::kill(-child.pid, signal) != 0) ::kill(child.pid, signal);
      child.signalled = true;
    }
    forwarded_ = count;
  }

  enum class Started { Yes, Skipped, Locked };

  void launch(const SweepCase& c, std::vector<Child>& running, std::vector<const SweepCase*>& waiting, bool waited) {
    try {
      Child child;
      switch (start(c, waited, child)) {
        case Started::Yes: running.push_back(std::move(child)); break;
        case Started::Locked: waiting.push_back(&c); break;
        case Started::Skipped: break;
      }
    } catch (const IoError& e) {
      say("failed " + c.id + ": " + e.what());
      ++failed_;
      worst(kExitIo);
    }
  }

  /// A complete case file counts as the case's only if it was made with the case's options
  /// (those of the trajectory and its extent): a file put under the id by hand, or left by
  /// another grid, is refused untouched (IoError: the case fails, and says which option).
  static void refuse_unless_made_by(const SweepCase& c, const fs::path& final_file, const FileSummary& stored) {
    std::vector<std::string> arguments = c.arguments;
    arguments.insert(arguments.end(), {"--out", final_file.string()});
    const std::string difference =
        option_difference(parse_run_arguments(arguments), stored, {OptionRole::Trajectory, OptionRole::Extent});
    if (!difference.empty())
      throw IoError(final_file.string() + " is a complete run of other options (" + difference +
                    "); it was left untouched: move it away and run the sweep again");
  }

  /// Skips a done case, defers a locked one, else starts it.
  Started start(const SweepCase& c, bool waited, Child& child) {
    const fs::path final_file = file(c, ".h5");
    const std::string done_elsewhere = waited ? "(finished elsewhere) " : "";
    if (const auto stored = complete_run(final_file)) {
      refuse_unless_made_by(c, final_file, *stored);
      say("skip " + c.id + " complete " + done_elsewhere + label(c));
      ++skipped_complete_;
      return Started::Skipped;
    }
    auto lock = CaseLock::try_acquire(lock_path(options_.out_dir, c.id));
    if (!lock) {
      if (!waited) {
        say("wait " + c.id + " running elsewhere " + label(c));
        ++waited_;
      }
      return Started::Locked;
    }
    if (const auto stored = complete_run(final_file)) {  // finished by another process since the first look
      refuse_unless_made_by(c, final_file, *stored);
      say("skip " + c.id + " complete " + done_elsewhere + label(c));
      ++skipped_complete_;
      return Started::Skipped;
    }
    const fs::path part = file(c, ".h5.part");
    bool resuming = false;
    std::error_code error;
    if (fs::exists(part, error)) {
      resuming = options_.resume && is_mfattn_file(part.string());
      if (!resuming) remove_file(part);
    }
    child.c = &c;
    child.lock = std::move(lock);
    child.resuming = resuming;
    spawn(child);
    say(std::string(resuming ? "resume " : "run ") + c.id + " " + label(c));
    return Started::Yes;
  }

  static void remove_file(const fs::path& path) {
    std::error_code error;
    fs::remove(path, error);
    if (error) throw IoError("cannot remove " + path.string() + ": " + error.message());
  }

  /// The child between fork and exec: only async-signal-safe calls. It gets its own process
  /// group (the sweep signals the group), and SIGTERM when the sweep dies, however it dies.
  [[noreturn]] static void exec_child(char* const* argv, int null_fd, int log_fd, int lock_fd, int keep_fd,
                                      pid_t parent, const sigset_t& mask) {
    StopSignals::reset_in_child();
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the sweep died before prctl took effect
    if (::dup2(null_fd, STDIN_FILENO) < 0 || ::dup2(log_fd, STDOUT_FILENO) < 0 || ::dup2(log_fd, STDERR_FILENO) < 0)
      ::_exit(127);
    // The child keeps the case lock open (dup2 clears close-on-exec on the copy) until it ends.
    if (keep_fd >= 0 && ::dup2(lock_fd, keep_fd) < 0) ::_exit(127);
    ::pthread_sigmask(SIG_SETMASK, &mask, nullptr);
    ::execve("/proc/self/exe", argv, environ);
    ::_exit(127);
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
    const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) throw IoError("cannot create " + log + ": " + std::strerror(errno));
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0) {
      const int error = errno;
      ::close(log_fd);
      throw IoError(std::string("cannot open /dev/null: ") + std::strerror(error));
    }
    const pid_t parent = ::getpid();
    // No signal handler may run in the child before exec: block everything around fork.
    sigset_t all, mask;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &mask);
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(argv.data(), null_fd, log_fd, child.lock->fd(), reserved_fd_, parent, mask);
    const int error = errno;
    ::pthread_sigmask(SIG_SETMASK, &mask, nullptr);
    ::close(log_fd);
    ::close(null_fd);
    if (pid < 0) throw IoError("cannot start mfattn run for case " + c.id + ": " + std::strerror(error));
    ::setpgid(pid, pid);  // the child does the same; whichever comes first
    child.pid = pid;
    child.signalled = false;
#ifdef SYS_pidfd_open
    child.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
    child.start = std::chrono::steady_clock::now();
  }

  /// Index of a child that has ended (not yet reaped); nullopt after timeout_ms (-1: none)
  /// or when a stop signal arrived.
  std::optional<std::size_t> wait_any(const std::vector<Child>& running, int timeout_ms) const {
    auto ended = [&]() -> std::optional<std::size_t> {
      for (std::size_t i = 0; i < running.size(); ++i) {
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(running[i].pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            info.si_pid == running[i].pid)
          return i;
      }
      return std::nullopt;
    };
    const auto begin = std::chrono::steady_clock::now();
    for (;;) {
      if (auto i = ended()) return i;
      if (StopSignals::count() != forwarded_) return std::nullopt;  // for the caller to forward
      const bool pollable = std::all_of(running.begin(), running.end(), [](const Child& c) { return c.pidfd >= 0; });
      std::vector<pollfd> fds;
      const int wake = StopSignals::wake_fd();
      if (wake >= 0) fds.push_back({wake, POLLIN, 0});
      if (pollable)
        for (const auto& c : running) fds.push_back({c.pidfd, POLLIN, 0});
      int wait_ms = pollable ? 1000 : 2;
      if (timeout_ms >= 0) {
        const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - begin).count();
        if (spent >= timeout_ms) return ended();
        wait_ms = std::min<int>(wait_ms, static_cast<int>(timeout_ms - spent));
      }
      ::poll(fds.data(), fds.size(), wait_ms);
      if (wake >= 0 && !fds.empty() && (fds[0].revents & POLLIN)) {
        StopSignals::drain_wake();
        if (auto i = ended()) return i;
        return std::nullopt;
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
    std::error_code ignored;
    if (child.signalled && code != kExitNumerical) {
      // Stopped by the sweep's own signal: not a failure of the case. Its .part stays for a
      // rerun (which restarts it, or continues it with --resume).
      const std::string how = signal_name(StopSignals::received());
      std::ofstream(file(c, ".log"), std::ios::app)
          << "mfattn sweep: interrupted: " << how << " (" << describe_exit(status) << ")\n";
      say("interrupted " + c.id + " by " + how + " after " + format_seconds(seconds) + ", " +
          (fs::exists(part, ignored) ? part.filename().string() + " kept" : "no file yet"));
      undone_.interrupted.push_back(c.id);
      return std::nullopt;
    }
    if (code == kExitUsage && child.resuming && StopSignals::received() == 0) {
      say("restart " + c.id + ": its interrupted file cannot be resumed (see " + file(c, ".log").string() + ")");
      remove_file(part);
      child.resuming = false;
      spawn(child);
      return child;
    }
    const std::string reason = describe_exit(status);
    std::ofstream(file(c, ".log"), std::ios::app) << "mfattn sweep: " << reason << '\n';
    // A killed or interrupted case keeps its .part (the next sweep restarts it, or continues
    // it with --resume); a refused one leaves nothing.
    if (exited && code != kExitNumerical && ending_signal(status) == 0) fs::remove(part, ignored);
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
  int forwarded_ = 0;
  std::size_t ran_ = 0, skipped_complete_ = 0, waited_ = 0, failed_ = 0, not_started_ = 0;
  Undone undone_;
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
    if (options.threads > 0 && plan.sets_threads)
      throw UsageError(
          "--threads " + std::to_string(options.threads) + ": " + options.config +
          " sets threads itself (in its base, an axis or a derived line); drop one of the two");
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
      const std::string values = case_values_text(plan, c, " ");
      out << (values.empty() ? "" : " ") << values << '\n';
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
  const int threads = options.threads > 0 ? options.threads : std::max(1, cores / options.jobs);
  std::size_t ran = 0, skipped_complete = 0, waited = 0, failed = 0, not_started = 0;
  Undone undone;
  // Handlers from here to the end: a signal during the manifest still ends in 128 + signal.
  const StopSignals stop_signals({.keep_ignored = true, .restart_calls = false, .wake_pipe = true,
                                  .end_on_late_repeat = false});
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
    waited = runner.waited();
    failed = runner.failed();
    undone = runner.undone();
    not_started = runner.not_started();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  const std::size_t undone_count = undone.interrupted.size() + not_started;
  out << prefix << mine.size() << " cases here: " << ran << " ran, " << skipped_complete << " skipped (complete), "
      << waited << " waited for (running elsewhere), " << failed << " failed, " << undone_count << " undone, in "
      << format_seconds(seconds) << std::endl;

  comm.barrier();
  if (comm.rank() == 0 && fs::is_directory(options.out_dir, error)) {
    try {
      std::size_t complete = 0, bad = 0, busy = 0, interrupted = 0, missing = 0;
      for (const auto& status : write_manifest(plan, options.out_dir)) {
        switch (status.state) {
          case CaseStatus::State::Complete: ++complete; break;
          case CaseStatus::State::Failed: ++bad; break;
          case CaseStatus::State::Running: ++busy; break;
          case CaseStatus::State::Interrupted: ++interrupted; break;
          case CaseStatus::State::Missing: ++missing; break;
        }
      }
      out << prefix << "manifest " << (fs::path(options.out_dir) / "manifest.csv").string() << " (and .json): "
          << plan.cases.size() << " cases, " << complete << " complete, " << bad << " failed, " << busy
          << " running, " << interrupted << " interrupted, " << missing << " missing" << std::endl;
    } catch (const IoError& e) {
      err << prefix << e.what() << std::endl;
      code = code == kExitOk || code == kExitNumerical ? kExitIo : code;
    }
  }
  const int signal = StopSignals::received();
  if (signal != 0) {
    std::ostringstream line;
    line << prefix << "stopped by " << signal_name(signal) << ": ";
    if (undone_count == 0) {
      line << "no case of this share was left undone";
    } else {
      line << undone_count << " of " << mine.size() << " cases of this share undone";
      if (!undone.interrupted.empty()) {
        line << "; " << undone.interrupted.size() << " interrupted (.part kept):";
        for (const auto& id : undone.interrupted) line << ' ' << id;
      }
      if (not_started > 0) {
        line << "; " << not_started << " not started:";
        for (const auto& id : undone.not_started) line << ' ' << id;
        if (not_started > undone.not_started.size())
          line << " and " << not_started - undone.not_started.size() << " more";
      }
      line << "; run the same command again to finish them"
           << (undone.interrupted.empty() ? "" : " (with --resume to continue the interrupted ones)");
    }
    err << line.str() << std::endl;
  }
  const int all = comm.max(code == kExitUsage ? 3 : code == kExitIo ? 2 : code == kExitNumerical ? 1 : 0);
  const int any_signal = comm.max(signal);
  if (any_signal != 0) return 128 + any_signal;
  return all == 3 ? kExitUsage : all == 2 ? kExitIo : all == 1 ? kExitNumerical : kExitOk;
}

}  // namespace mfattn
