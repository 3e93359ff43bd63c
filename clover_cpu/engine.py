"""Continuous batching for the server: one thread owns the model and decodes up to `parallel` sequences
together. Each sequence is the decoding loop of clover_cpu.decode (decode_steps), which asks for
forwards instead of running them; every round the engine takes one pending forward from each active
sequence, runs them as one batched forward (Model.run_batch: one product per weight for all of them,
each sequence on its own KV cache and recurrent state) and one output-head product over all the rows
they need, and hands each sequence its logits. A sequence joins or leaves between rounds. Its events
(tokens as they become final, the end, an error) go to the caller through a callback, from the engine
thread.

Prompt caching: a finished sequence's cache stays in a pool (`cache_slots` caches in all, those decoding
included; default `parallel`), with what it committed and checkpoints (Cache.mark) where its first user
message begins and a few tokens before its prompt's end. A new request takes the cache that already holds
the longest part of its prompt, whole or back to its newest checkpoint, and reads only the rest: a chat's
next turn (the conversation so far, then a new message) or an agent's next step costs its new tokens. A
request that shares only the start of another conversation (its system prompt and tools) gets a copy of
that part in a cache of its own, so both conversations stay cached. The caches are those the whole prompt
would leave (committing in parts gives the same states, up to float rounding where a part takes another
kernel path), so the reply is the same, as with batching.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .decode import Event, Forward, Options, block_grid, decode_steps, span_rows


class QueueFull(Exception):
    """The engine's queue holds its maximum of waiting requests."""


class Cancelled(Exception):
    pass


class ForwardFailed(RuntimeError):
    """A batched forward failed (corrupt weights, out of memory): every sequence in it ends with this."""


@dataclass
class Job:
    """One generation: prompt ids, decoding options, and `emit(kind, payload)` called from the engine
    thread with ("event", Event), ("error", exception) or ("end", None) (always last)."""

    prompt_ids: list
    options: Options
    emit: Callable
    want_steps: bool = False  # deliver "step" events (each denoising step's block); else they are dropped here
    cache_prompt: bool = True  # start from a pooled cache that holds the start of the prompt, if one does
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False  # ended by its caller's choice (a stop string), not because the caller left
    first_token_at: float | None = None
    cached_tokens: int = 0  # prompt tokens a pooled cache already held (not read again)
    forwards: int = 0  # forwards that produced logits for it (each decoding forward, and the prompt's last)
    # engine state
    steps: object = None
    cache: object = None
    pending: Forward | None = None
    ended: bool = False  # its ("end", None) was emitted

    def cancel(self) -> None:
        """Stop the generation: it leaves the batch before the next forward (the caller has gone)."""
        self.cancelled.set()

    def stop(self) -> None:
        """Stop the generation because the caller has what it needs (a stop string): as cancel, but not
        counted as a cancelled request."""
        self.stopped = True
        self.cancelled.set()


@dataclass
class Metrics:
    requests_total: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0  # of those, the ones a pooled cache already held
    generated_tokens_total: int = 0
    forwards_total: int = 0  # batched forwards the engine ran
    sequence_forwards_total: int = 0  # per-sequence forwards in them that gave logits (as Job.forwards counts)
    busy_seconds_total: float = 0.0
    rejected_total: int = 0


class Engine:
    """Runs Jobs on `model` with up to `parallel` sequences per batched forward; at most `max_queue`
    jobs wait for a slot (submit raises QueueFull beyond that)."""

    def __init__(self, model, *, parallel: int = 4, max_queue: int = 64, prefill_slice: int = 256,
                 cache_slots: int | None = None):
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if prefill_slice < 1:
            raise ValueError("prefill_slice must be >= 1")
        if cache_slots is not None and cache_slots < parallel:
            raise ValueError("cache_slots must be >= parallel")
        self.cache_slots = cache_slots or parallel
        self.model, self.parallel, self.max_queue = model, parallel, max_queue
        self.prefill_slice = prefill_slice
        self.metrics = Metrics()
        self._waiting: collections.deque[Job] = collections.deque()
        self._active: list[Job] = []
        self._free_caches: list = []  # finished sequences' caches, the least recently used first
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="clover-engine", daemon=True)
        self._thread.start()

    # -- called from other threads --

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._stop:
                raise RuntimeError("the engine is shutting down")
            free = max(0, self.parallel - len(self._active))  # slots the next round admits into
            if len(self._waiting) - free >= self.max_queue:
                self.metrics.rejected_total += 1
                raise QueueFull()
            self._waiting.append(job)
            self.metrics.requests_total += 1
            self._cv.notify()

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        return len(self._active)

    def shutdown(self, timeout: float | None = None, *, cancel: bool = False) -> None:
        """Stop taking jobs; finish (or with cancel=True, cancel) the ones admitted or waiting."""
        with self._cv:
            self._stop = True
            if cancel:
                for j in (*self._waiting, *self._active):
                    j.cancel()
            self._cv.notify()
        self._thread.join(timeout)

    # -- the engine thread --

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._active and not self._stop:
                    self._cv.wait()
                if self._stop and not self._waiting and not self._active:
                    return
                admitted = []
                while self._waiting and len(self._active) + len(admitted) < self.parallel:
                    admitted.append(self._waiting.popleft())
            try:
                for job in admitted:
                    self._start(job)
                self._active = [j for j in self._active if j.pending is not None]
                if self._active:
                    self._round()
            except Exception as e:  # a bug here must not leave requests waiting forever: they fail, the loop goes on
                for j in self._active + [j for j in admitted if j not in self._active]:
                    if not j.ended:
                        try:
                            self._finish(j, e, clear=True)
                        except Exception:
                            pass
                self._active = []

    def _start(self, job: Job) -> None:
        if job.cancelled.is_set():
            self._finish(job, Cancelled())
            return
        try:
            job.cache, job.cached_tokens = self._take_cache(job)
            job.steps = decode_steps(self.model, job.prompt_ids[job.cached_tokens :], job.options, job.cache,
                                     mark=True)
            self.metrics.prompt_tokens_total += len(job.prompt_ids)
            self.metrics.prompt_tokens_cached_total += job.cached_tokens
            self._advance(job, None, first=True)
        except Exception as e:  # a request's bad options or prompt: that request fails, nothing else
            self._finish(job, e)
            return
        if job.pending is not None:
            self._active.append(job)

    def _take_cache(self, job: Job):
        """A cache for the job and the prompt tokens it holds: the pooled one that holds the most of the
        prompt (rewound to them), or, where that is only an earlier checkpoint of it (another conversation
        that shares this one's system prompt), a copy of that part in a cache of its own, so the other
        conversation keeps its cache too; else an empty one, a new one while fewer than `cache_slots`
        exist (so that as many conversations stay cached), or the least recently used one, cleared."""
        best, best_n = None, 0
        if job.cache_prompt:
            c = self.model.config
            B, block = block_grid(c, job.options)
            for cache in self._free_caches:
                n = cache.reusable(job.prompt_ids, block, B, leave_last=c.shift_logits)
                if n > best_n:
                    best, best_n = cache, n
        if best is not None and best_n < best.n:
            # another conversation's start (an earlier checkpoint): copied, where a cache can be spared; the
            # same conversation's newest checkpoint (its next turn rendered differently, the same prompt
            # again): the cache is taken back to it, unless a slot is free anyway
            own = self._spare_cache(keep=best, evict=best_n != best.mark_n)
            if own is not None:
                own.copy_prefix(best, best_n)
                return own, best_n
        if best is None:
            cache = self._spare_cache()
            cache.clear()
            return cache, 0
        self._free_caches.remove(best)
        best.rewind(best_n)
        return best, best_n

    def _spare_cache(self, keep=None, evict: bool = True):
        """A cache to fill afresh: an empty pooled one, a new one while fewer than `cache_slots` exist, or
        (evict) the least recently used pooled one, if that is not `keep`; else None."""
        empty = [c for c in self._free_caches if not c.n and c is not keep]
        if empty:
            self._free_caches.remove(empty[0])
            return empty[0]
        if self._caches() < self.cache_slots or not self._free_caches:
            return self.model.new_cache()
        if not evict or self._free_caches[0] is keep:
            return None
        return self._free_caches.pop(0)

    def _caches(self) -> int:
        """Caches that exist: pooled, and held by the sequences decoding."""
        return len(self._free_caches) + sum(j.cache is not None for j in self._active)

    def _advance(self, job: Job, out, first: bool = False) -> None:
        """Run the job's loop until it asks for its next forward (job.pending) or ends."""
        job.pending = None
        msg = next(job.steps) if first else job.steps.send(out)
        while True:
            if isinstance(msg, Forward):
                job.pending = msg
                return
            self._deliver(job, msg)
            if msg.kind == "done":
                self._finish(job, None)
                return
            msg = next(job.steps)

    def _slice(self, f: Forward) -> tuple[Forward, Forward | None]:
        """A committing forward of more than prefill_slice tokens (a prompt's chunk) -> its first slice and
        the rest, or (f, None). The cut falls on the block grid (block-causal attention sees a whole block,
        so a block is never split) and before every row read; committing in slices gives the caches a
        single commit would (Model.run)."""
        T, B = len(f.tokens), f.block or 1
        if f.commit != T or T <= self.prefill_slice:
            return f, None
        n0 = f.cache.n
        cut = (n0 + max(self.prefill_slice, B)) // B * B - n0
        if cut <= 0 or cut >= T or (f.rows and min(f.rows) < cut):
            return f, None
        return (Forward(f.cache, f.tokens[:cut], cut, f.block, []),
                Forward(f.cache, f.tokens[cut:], T - cut, f.block, [r - cut for r in f.rows]))

    def _deliver(self, job: Job, ev: Event) -> None:
        if (ev.kind == "step" and not job.want_steps) or ev.kind == "prefill":  # (the server shows neither)
            return
        if ev.kind == "tokens":
            if ev.tokens and job.first_token_at is None:
                job.first_token_at = time.perf_counter()
            self.metrics.generated_tokens_total += len(ev.tokens)
        job.emit("event", ev)

    def _finish(self, job: Job, error: BaseException | None, clear: bool = False) -> None:
        """End the job; its cache goes back to the pool (cleared where a forward failed in the middle:
        `clear`, or a ForwardFailed error; a request's own error comes between forwards)."""
        job.pending, job.ended = None, True
        if job.steps is not None:
            job.steps.close()
            job.steps = None
        if job.cache is not None:
            cache, job.cache = job.cache, None
            o = job.options
            if clear or isinstance(error, ForwardFailed):
                cache.clear()  # (a forward that failed may have left some layers' states advanced)
            elif o.reuse or (o.mode == "auto" and not self.model.config.shift_logits):
                # approximate decoding commits states exact decoding would not: keep the prompt's part only
                cache.rewind(cache.mark_n or 0)
            self._free_caches.append(cache)
            if self._caches() > self.cache_slots:  # (made beyond the slots while all were in use)
                self._free_caches.pop(0)
        if isinstance(error, Cancelled):
            self.metrics.requests_cancelled += not job.stopped
        elif error is not None:
            self.metrics.requests_failed += 1
            job.emit("error", error)
        job.emit("end", None)

    def _round(self) -> None:
        """One batched forward over every active job's pending Forward."""
        jobs = []
        for j in self._active:
            if j.cancelled.is_set():
                self._finish(j, Cancelled())
            else:
                jobs.append(j)
        if not jobs:
            self._active = []
            return
        t0 = time.perf_counter()
        # a prompt shares its forwards with sequences that are decoding: in slices, so that their tokens keep
        # coming while it is read (alone, a prompt runs in the decoder's own chunks)
        parts = [self._slice(j.pending) if len(jobs) > 1 else (j.pending, None) for j in jobs]
        fwds = [f for f, _ in parts]
        try:
            picks = [span_rows(f.rows) for f in fwds]
            hs = self.model.run_batch([(f.cache, f.tokens, f.commit, f.block, srt) for f, (srt, _) in zip(fwds, picks)])
            rows = [h[where] for h, f, (_, where) in zip(hs, fwds, picks) if f.rows]
            logits = self.model.logits(np.concatenate(rows)) if rows else None
        except Exception as e:  # the model failed (corrupt weights, out of memory): these jobs fail
            failed = ForwardFailed(f"the forward failed: {type(e).__name__}: {e}")
            for j in jobs:
                self._finish(j, failed)
            self._active = []
            return
        self.metrics.forwards_total += 1
        self.metrics.busy_seconds_total += time.perf_counter() - t0
        k = 0
        for j, f, (_, rest) in zip(jobs, fwds, parts):
            if rest is not None:  # the prompt's next slice, next round (its first slices read no rows)
                j.pending = rest
                continue
            out = None
            if f.rows:
                out, k = logits[k : k + len(f.rows)], k + len(f.rows)
                j.forwards += 1
                self.metrics.sequence_forwards_total += 1
            try:
                self._advance(j, out)
            except Exception as e:
                self._finish(j, e)
        self._active = [j for j in jobs if j.pending is not None]
