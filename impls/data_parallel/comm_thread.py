"""The communication thread that lets a data-parallel step overlap its all-reduces.

Our collectives block the calling thread, so overlapping communication with computation
(DDP's buckets during backward, Li et al., VLDB 2020; DGA's averages across steps, Zhu et
al., NeurIPS 2021) needs a second thread that runs them while the training thread goes
on. It works over its own process group (`thread_communicator`): two threads must never
share a group's message stream. Jobs run one at a time in the order they were handed
over, so every rank issues the same collectives in the same order.

A job that raises is not raised on this thread, where nobody would see it: the error is
kept and re-raised on the training thread when it next waits, and the jobs after it are
skipped, since once one rank has failed a collective the ranks' streams no longer match.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["CommThread"]

Job = TypeVar("Job")


class CommThread(Generic[Job]):
    """Runs `work(job)` on a daemon thread for each job `submit`ted, in order, until `close`.

    `failure` names a job in the error raised on the training thread, e.g. "a bucket
    all-reduce" gives "a bucket all-reduce failed on the communication thread".
    """

    def __init__(self, work: Callable[[Job], None], *, name: str, failure: str) -> None:
        self._work = work
        self._failure = failure
        self._queue: queue.Queue[tuple[Job, threading.Event] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> threading.Event:
        """Hand `job` over; the returned event is set once it has run (or was skipped)."""
        done = threading.Event()
        self._queue.put((job, done))
        return done

    def wait(self, done: threading.Event) -> None:
        """Block until the job of `done` has run; re-raise a failure of any job so far."""
        done.wait()
        self._raise_failure()

    def wait_all(self) -> None:
        """Block until every job handed over has run; re-raise a failure of any of them."""
        self._queue.join()
        self._raise_failure()

    def close(self) -> None:
        """Stop the thread once the jobs already handed over have run."""
        self._queue.put(None)
        self._thread.join()

    def _raise_failure(self) -> None:
        if self._error is not None:
            message = f"{self._failure} failed on the communication thread"
            raise RuntimeError(message) from self._error

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            job, done = item
            try:
                if self._error is None:  # after a failure the ranks' streams no longer match
                    self._work(job)
            except BaseException as err:  # re-raised on the training thread
                self._error = err
            finally:
                done.set()
                self._queue.task_done()
        self._queue.task_done()
