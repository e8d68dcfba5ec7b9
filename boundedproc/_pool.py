"""``run_async``'s threads: a pool whose idle threads end, the most recently idle first used.

A thread that has run a contained command keeps a supervisor process for as long as
it lives (``_native``: one per calling thread, reused from run to run, freed when the
thread ends).  ``concurrent.futures.ThreadPoolExecutor`` never ends a thread, so a
burst of 100 concurrent ``run_async`` calls would leave 100 idle threads and 100
idle supervisors for the rest of the process's life.  Here a thread that gets no
work for ``idle_seconds`` ends, and its supervisor with it.

Work goes to the thread that became idle last (a stack), not to every idle thread in
turn (``ThreadPoolExecutor``'s shared queue wakes its waiters first come, first
served): after a burst, a steady trickle of runs keeps reusing the same few warm
threads, with their supervisors, and the rest reach their idle timeout.  Past
``max_threads`` busy threads, work waits in a queue, first in, first out.

At interpreter exit the pool behaves as ``ThreadPoolExecutor`` does: threads are not
daemons, so runs in flight finish (each is bounded by its own timeout) and queued
work still runs, while idle threads are woken to end at once instead of waiting out
their idle time.  A daemon thread would instead be frozen mid-run at exit, leaving
an uncontained command running with no one to enforce its deadline.

Where no thread can be started (the system's process slots are used up), work waits
for a busy thread of the pool; with none, ``submit`` raises ``NoThread``, which a
caller turns into a result (``run_async``: a ``spawn failed: EAGAIN`` result; the
grader: the check runs in the calling thread, where its own spawn then reports it).
It is a ``concurrent.futures.Executor``, so ``shutdown`` works as with any other.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

_Item = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _wait_gone(native_id: int | None, within: float = 0.1) -> None:
    """Wait (at most ``within`` seconds) until the OS thread ``native_id`` has left the
    process: before 3.13, ``Thread.join()`` returns when the thread's Python state is
    gone, a moment before the thread itself (which a fork then still counts)."""
    task = f"/proc/self/task/{native_id}"
    if native_id is None or not os.path.isdir("/proc/self/task"):
        return
    until = time.monotonic() + within
    while os.path.exists(task) and time.monotonic() < until:
        time.sleep(0.0002)


class NoThread(RuntimeError):
    """No thread could be started (out of process slots or memory) and the pool has none."""


class _Idle:
    """An idle thread's place in the stack: its wake-up, and the work handed to it."""

    __slots__ = ("item", "thread", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()
        self.wake.acquire()  # released once, by whoever hands over work or shuts the pool down
        self.item: _Item | None = None
        self.thread = threading.current_thread()


class IdlePool(Executor):
    """Up to ``max_threads`` threads; one idle for ``idle_seconds`` ends (module docstring)."""

    def __init__(self, max_threads: int, idle_seconds: float, name: str) -> None:
        self._max = max_threads
        self._idle_seconds = idle_seconds
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[_Idle] = []          # a stack: the last one idle is used first
        self._queued: deque[_Item] = deque()  # work waiting for a thread (all busy)
        self._threads: set[threading.Thread] = set()  # started and not ended, busy or idle
        self._closed = False
        self._numbers = itertools.count()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on a thread of the pool; its future.

        Where a new thread is needed and cannot be started (the system's process
        slots are used up), the work waits for one of the pool's busy threads.

        Raises:
            NoThread: no thread could be started and the pool has none.
            RuntimeError: the interpreter is shutting down.
        """
        future: Future[Any] = Future()
        item: _Item = (future, fn, args, kwargs)
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._hand_over(item):
                return future
            if len(self._threads) >= self._max:
                self._queued.append(item)
                return future
            thread = threading.Thread(target=self._work, args=(item,),
                                      name=f"{self._name}_{next(self._numbers)}")
            self._threads.add(thread)
        try:
            thread.start()
        except RuntimeError as err:  # "can't start new thread": EAGAIN or ENOMEM
            with self._lock:
                self._threads.discard(thread)
                if not self._hand_over(item):  # none came back meanwhile
                    if not self._threads:
                        raise NoThread(str(err)) from err
                    self._queued.append(item)  # a busy one takes it before it parks
        return future

    def _hand_over(self, item: _Item) -> bool:
        """Under the lock: give ``item`` to the thread idle the shortest time, if one is."""
        if not self._idle:
            return False
        idle = self._idle.pop()
        idle.item = item
        idle.wake.release()
        return True

    def threads(self) -> int:
        """How many threads the pool has now, busy or idle."""
        with self._lock:
            return len(self._threads)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; wake the idle threads to end (busy ones end after their work,
        and after the queued work unless ``cancel_futures``); with ``wait``, join them."""
        with self._lock:
            if cancel_futures:
                while self._queued:
                    self._queued.popleft()[0].cancel()
            if not self._closed:
                self._closed = True
                for idle in self._idle:
                    idle.wake.release()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()

    def end_idle(self) -> None:
        """End the idle threads now and join them; busy threads, and the pool, go on.

        Before ``os.fork()``: a caller that forks after its last run is then not
        multi-threaded because of idle threads (Python 3.12+ warns of a fork with
        threads), and the child would not have them anyway.
        """
        # Best effort, bounded: a fork from a signal handler that interrupted this very
        # thread inside submit() finds the lock held by itself, and must not wait for it.
        if not self._lock.acquire(timeout=0.1):
            return
        try:
            if self._closed:  # shutdown() woke them already (interpreter exit)
                return
            ending, self._idle = self._idle, []
            for idle in ending:
                idle.wake.release()  # with no item: it ends (_wait)
        finally:
            self._lock.release()
        for idle in ending:
            idle.thread.join(1.0)
            _wait_gone(idle.thread.native_id)

    def _work(self, item: _Item | None) -> None:
        idle = _Idle()
        while item is not None:
            future, fn, args, kwargs = item
            item = None
            running = future.set_running_or_notify_cancel()
            failed, value = False, None
            if running:
                try:
                    value = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - as ThreadPoolExecutor: the future carries it
                    failed, value = True, exc
            # Back on the stack before the caller hears of the result, so that the work
            # it submits next, on hearing it, finds this thread rather than another.
            with self._lock:
                if self._queued:
                    item = self._queued.popleft()
                elif self._closed:
                    self._end()
                else:
                    self._idle.append(idle)
                parked = item is None and not self._closed
            if running:
                if failed:
                    future.set_exception(value)
                else:
                    future.set_result(value)
            del future, fn, args, kwargs, value  # an idle thread holds nothing of its last work
            if parked:
                item = self._wait(idle)

    def _end(self) -> None:
        """Under the lock: this thread ends (it returns next)."""
        self._threads.discard(threading.current_thread())

    def _wait(self, idle: _Idle) -> _Item | None:
        """The work handed to this (parked) thread, or None when it is to end."""
        woken = idle.wake.acquire(timeout=self._idle_seconds)
        with self._lock:
            item, idle.item = idle.item, None
            if item is None:  # timed out, or woken by shutdown() or end_idle()
                if idle in self._idle:  # not taken off by end_idle()
                    self._idle.remove(idle)
                self._end()
                return None
            if not woken:  # work came between the timeout and this lock: take it
                idle.wake.acquire()  # released already; leaves it held for the next wait
            return item
