"""How every PyTorch-side process of ours (the oracles here, the torchrun launches in tools/bench) ends.

    from peer_exit import end_process_group
    ...
    end_process_group(status)      # never returns: every rank leaves together, with `status`

Why a plain `dist.destroy_process_group()` followed by a normal interpreter exit is not enough (CI failed 2 runs
in 8 with `terminate called without an active exception`, SIGABRT, after the script had printed its result):
- ProcessGroupGloo runs each collective on a worker thread. The thread marks a Work complete (the main thread's
  wait returns) and only then, a moment later, drops its own reference to the Work. When that is the last
  reference, the Work's tensors are freed on the worker thread, and a tensor made in Python decrefs its Python
  object there, which takes the GIL.
- `destroy_process_group` unregisters the group and calls shutdown(), but it joins Gloo's worker threads only
  when the ProcessGroup object dies. DTensor's caches (the redistribute planner's, the sharding propagator's)
  keep the DeviceMesh, and through it the group, alive after it: the threads live on.
- Python's finalization then races that worker thread: a thread that asks for the GIL while the interpreter is
  finalizing is ended with pthread_exit, whose forced unwind through the noexcept Work destructor is
  std::terminate (core dump: ~AsyncAllgatherCoalescedWork <- ProcessGroupGloo::runLoop <- take_gil ->
  PyThread_exit_thread, while the main thread is in Py_FinalizeEx).

So each rank ends in this order:
1. `barrier()`: every rank has finished every collective it issued, so no peer still needs a message from us.
2. `destroy_process_group()`.
3. stdout and stderr flushed, then `os._exit(status)`: the process ends without finalizing the interpreter, so
   no Gloo thread can race finalization, whatever object still holds the group. (multiprocessing's fork workers
   end the same way.) Every file the script wrote is closed before it calls this.
A failure in 1 or 2 (a peer died) prints its traceback and ends the rank with status 1 (or `status` if nonzero):
nothing is ignored.
"""
import os
import sys
import traceback


def end_process_group(status=0):
    """Ends this rank: barrier, destroy_process_group, flush, os._exit(status). Does not return."""
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported, and the rank fails
        traceback.print_exc()
        status = status or 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(status))
