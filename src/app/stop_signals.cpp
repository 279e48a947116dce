#include "mfattn/app/stop_signals.hpp"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <stdexcept>

namespace mfattn {
namespace {

// What the handler reads and writes: lock-free atomics, safe in a handler on any thread.
static_assert(std::atomic<int>::is_always_lock_free);
static_assert(std::atomic<bool>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

/// The first stop signal (0: none yet) and how many have come.
std::atomic<int> first_signal{0};
std::atomic<int> signal_count{0};
/// When the first stop signal came (CLOCK_MONOTONIC nanoseconds).
std::atomic<std::int64_t> first_signal_ns{0};
/// The installer's end_on_late_repeat, and the write end of its wake pipe (-1: none).
std::atomic<bool> end_on_late_repeat{false};
std::atomic<int> wake_write_fd{-1};

/// The rest belongs to the installing thread, under installation_mutex.
std::mutex installation_mutex;
int users = 0;
StopSignals::Options installed_options;
int wake_pipe[2] = {-1, -1};
std::array<bool, kStopSignals.size()> installed{};
std::array<struct sigaction, kStopSignals.size()> previous{};

std::int64_t monotonic_ns() {
  struct timespec now {};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return std::int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

extern "C" void on_stop_signal(int signal) {
  const int saved_errno = errno;
  const std::int64_t now = monotonic_ns();
  if (first_signal.load() == 0) {
    first_signal_ns = now;
    first_signal = signal;
  } else if (end_on_late_repeat.load() && now - first_signal_ns.load() >= 1000000000) {
    // A repeat a second or more after the first ends the process at once (stop_signals.hpp).
    std::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  signal_count.fetch_add(1);
  if (const int fd = wake_write_fd.load(); fd >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t written = ::write(fd, &byte, 1);
  }
  errno = saved_errno;
}

}  // namespace

StopSignals::StopSignals(Options options) {
  const std::lock_guard<std::mutex> lock(installation_mutex);
  if (users > 0) {
    if (!(options == installed_options))
      throw std::logic_error("StopSignals: overlapping users ask for different options");
    ++users;
    return;
  }
  ++users;
  installed_options = options;
  first_signal = 0;
  signal_count = 0;
  first_signal_ns = 0;
  end_on_late_repeat = options.end_on_late_repeat;
  if (options.wake_pipe && ::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    wake_pipe[0] = wake_pipe[1] = -1;
  wake_write_fd = wake_pipe[1];
  for (std::size_t k = 0; k < kStopSignals.size(); ++k) {
    if (options.keep_ignored) {
      struct sigaction current {};
      ::sigaction(kStopSignals[k], nullptr, &current);
      if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) continue;
    }
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = options.restart_calls ? SA_RESTART : 0;
    installed[k] = ::sigaction(kStopSignals[k], &action, &previous[k]) == 0;
  }
}

StopSignals::~StopSignals() {
  const std::lock_guard<std::mutex> lock(installation_mutex);
  if (--users > 0) return;
  for (std::size_t k = 0; k < kStopSignals.size(); ++k)
    if (installed[k]) {
      ::sigaction(kStopSignals[k], &previous[k], nullptr);
      installed[k] = false;
    }
  wake_write_fd = -1;
  for (int& fd : wake_pipe)
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
}

int StopSignals::received() noexcept { return first_signal.load(); }
const std::atomic<int>& StopSignals::received_flag() noexcept { return first_signal; }

int StopSignals::count() noexcept { return signal_count.load(); }

int StopSignals::wake_fd() noexcept { return wake_pipe[0]; }

void StopSignals::drain_wake() noexcept {
  if (wake_pipe[0] < 0) return;
  char buffer[64];
  while (::read(wake_pipe[0], buffer, sizeof buffer) > 0) {
  }
}

void StopSignals::reset_in_child() noexcept {
  for (std::size_t k = 0; k < kStopSignals.size(); ++k)
    if (installed[k]) {
      struct sigaction standard {};
      standard.sa_handler = SIG_DFL;
      ::sigaction(kStopSignals[k], &standard, nullptr);
    }
}

}  // namespace mfattn
