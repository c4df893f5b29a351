// A rank that dies of a fatal signal says so, and where, before it dies.
//
// A segmentation fault, a bus error, an illegal instruction (a kernel this CPU lacks), a floating-point trap or an
// abort otherwise ends a rank with nothing on its output but the launcher's "killed by signal 11". Once installed,
// the handler writes one line to stderr, `dtensor: rank R (pid P): fatal signal SIGSEGV (Segmentation fault) at
// address 0x...`, then the native backtrace (glibc's backtrace_symbols_fd: module, symbol where exported, offset:
// `addr2line -e MODULE OFFSET` names the line), and dies of the same signal, so the exit status is unchanged
// (c10's FatalSignalHandler does the same for Python). init_process_group installs it; a tool may earlier.
#pragma once

namespace dtensor {

// Installs the report for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT where the disposition is still the default
// (a handler the program installed stays). Idempotent; the rank in the line is the environment's RANK, if any.
void report_fatal_signals();

}  // namespace dtensor
