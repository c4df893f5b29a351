// The fatal-signal report (include/dtensor/mesh/fatal_signals.h). The handler runs on its own stack (a stack
// overflow is a SIGSEGV too) and calls only async-signal-safe functions (write, backtrace_symbols_fd once
// backtrace was warmed up outside the handler, sigaction, raise), formatting numbers by hand.
#include "dtensor/mesh/fatal_signals.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace dtensor {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
char rank_text[16] = "?";

void put(const char* s) {
  const ssize_t ignored = write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

void put_number(uintptr_t v, int base) {
  char buf[24];
  int i = sizeof buf - 1;
  buf[i] = '\0';
  do {
    buf[--i] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0 && i > 0);
  put(buf + i);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    default: return "SIGABRT";
  }
}

void on_fatal(int sig, siginfo_t* info, void*) {
  put("dtensor: rank ");
  put(rank_text);
  put(" (pid ");
  put_number(static_cast<uintptr_t>(getpid()), 10);
  put("): fatal signal ");
  put(signal_name(sig));
  put(" (");
  put(sigdescr_np(sig) != nullptr ? sigdescr_np(sig) : "?");
  put(")");
  if (sig != SIGABRT && info != nullptr) {
    put(" at address 0x");
    put_number(reinterpret_cast<uintptr_t>(info->si_addr), 16);
  }
  put("; backtrace:\n");
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  // The default action, so the process dies of this signal (SA_RESETHAND restored it).
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void report_fatal_signals() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* r = std::getenv("RANK"); r != nullptr && std::strlen(r) < sizeof rank_text) {
      std::strcpy(rank_text, r);
    }
    void* warm[1];
    backtrace(warm, 1);  // loads libgcc's unwinder now: the first call allocates, which a handler must not
    static char alt_stack[64 * 1024];
    stack_t ss{};
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof alt_stack;
    sigaltstack(&ss, nullptr);
    for (int sig : kSignals) {
      struct sigaction old {};
      if (sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
      struct sigaction sa {};
      sa.sa_sigaction = on_fatal;
      sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
      sigemptyset(&sa.sa_mask);
      sigaction(sig, &sa, nullptr);
    }
  });
}

}  // namespace dtensor
