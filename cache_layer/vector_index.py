"""The answer cache's in-process semantic index: per scope, the entries' vectors for a
nearest-neighbour search, their questions and the exact keys of the rows (so an exact miss costs
no query).

**Search.** A scope's vectors live in one of two tiers. Up to :data:`EXACT_MAX_ROWS` rows: a
``(n, dim)`` float32 numpy matrix searched exactly (a dot product: at 8,192 × 384 about a tenth of
a millisecond). Above that: a faiss inverted-file index (``IndexIVFFlat``, inner product over unit
vectors, :data:`IVF_NPROBE` lists probed), which keeps a lookup under a millisecond at 1,000,000
rows where an exact product costs 100+ ms (bench/README.md, ``cache_speed.py --steady``). The
inverted file is approximate about *which* rows it returns (recall measured there), never about
their cosines (the stored float32 vectors are compared exactly), and ``cache_layer.services``
confirms every candidate against its row and the guard, so an approximate search can only miss.
A scope passes to the inverted file (and is retrained when it grew fourfold since its training)
in a background thread, from the vectors in memory: the old tier serves meanwhile, and changes
made during the build are replayed onto the new one before it is swapped in.

**Changes.** Every insert and deletion is incremental: an addition is an append (exact tier) or
one centroid assignment (inverted file), a deletion a swap with the last row or a removal from
one list, O(dim) either way; nothing is ever reloaded on a lookup because entries expired, were
evicted by the size bound or deleted. This process's own stores and deletions are applied at
commit (:func:`remember`, :func:`discard`, :func:`clear`). Other workers' changes come from the
change log (:class:`~cache_layer.models.CacheChange`, written in the same transaction as each
change): at most every ``KEFU_CACHE_INDEX_REFRESH_MS``, one query reads the rows after the last id
this process applied (all scopes at once), and a second the new entries' vectors. Ids allocated
by transactions that had not committed yet are kept as gaps and asked for again for
:data:`GAP_TIMEOUT_S`. A process that read no change for close to
:data:`CHANGE_LOG_RETENTION_S` (the log is trimmed after that) reloads its scopes in background
threads and serves the old indexes meanwhile; so does the first lookup of a scope larger than
:data:`SYNC_LOAD_MAX_ROWS` (it misses until the load is in).

An index that is stale about other workers' changes can only miss: a deleted or expired entry it
still holds is refused by the row check in ``cache_layer.services``.

Threads: one lock per scope index covers its searches and changes (each well under a
millisecond); background builds run outside it (numpy and faiss release the GIL) and take it only
to replay and swap.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import faiss as _faiss
import numpy as np
from django.db import close_old_connections, connection
from django.db.models import Max, Q

from .config import cache_config
from .hot import current_hot_layer
from .models import CacheChange, CachedAnswer

log = logging.getLogger(__name__)
faiss: Any = _faiss  # its SWIG hints are partial (no DirectMap, C++ overloads): used untyped

#: Rows up to which a scope is searched exactly (numpy); above, by a faiss inverted file.
EXACT_MAX_ROWS = 8192
#: Inverted lists probed per search (measured: bench/README.md, ``cache_speed.py --steady``).
IVF_NPROBE = 16
#: A scope with more rows than this is loaded in a background thread at its first lookup.
SYNC_LOAD_MAX_ROWS = 5000
#: Change-log rows older than this (seconds) are trimmed; a process that read none for 80% of
#: it reloads its scopes (in the background) as it may have missed trimmed ones.
CHANGE_LOG_RETENTION_S = 3600.0
#: How long (seconds) an id missing from the log is asked for again (its transaction may commit).
GAP_TIMEOUT_S = 60.0
#: Change-log rows read per refresh at most; more are read at the next lookup.
CHANGES_PER_REFRESH = 5000

# One query per call: OpenMP threads only add overhead (and spin) on a busy web worker.
faiss.omp_set_num_threads(1)

# (id, question, embedding bytes, key_hash): a row as the index reads it.
Row = tuple[int, str, bytes, str]
_INDEX_COLUMNS = ("id", "question", "embedding", "key_hash")


# --- The two tiers -------------------------------------------------------------------------------------


class _Exact:
    """Exact tier: ``vecs[:n]`` ``(n, dim)`` float32 unit rows with ids ``ids[:n]``; a deletion
    moves the last row into the hole (``pos``: id -> row)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.vecs = np.zeros((16, dim), dtype=np.float32)
        self.ids = np.zeros(16, dtype=np.int64)
        self.pos: dict[int, int] = {}
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def add(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        need = self.n + len(ids)
        if need > len(self.ids):  # capacity doubles: an append is amortised O(dim)
            cap = max(16, 2 * len(self.ids), need)
            grown = np.zeros((cap, self.dim), dtype=np.float32)
            grown[: self.n] = self.vecs[: self.n]
            grown_ids = np.zeros(cap, dtype=np.int64)
            grown_ids[: self.n] = self.ids[: self.n]
            self.vecs, self.ids = grown, grown_ids
        self.vecs[self.n : need] = vecs
        self.ids[self.n : need] = ids
        for j, entry_id in enumerate(ids.tolist()):
            self.pos[entry_id] = self.n + j
        self.n = need

    def remove(self, entry_id: int) -> bool:
        i = self.pos.pop(entry_id, None)
        if i is None:
            return False
        last = self.n - 1
        if i != last:
            self.vecs[i] = self.vecs[last]
            moved = int(self.ids[last])
            self.ids[i] = moved
            self.pos[moved] = i
        self.n = last
        return True

    def search(self, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        sims = self.vecs[: self.n] @ vec
        k = min(k, self.n)
        top = np.argpartition(-sims, k - 1)[:k] if k < self.n else np.arange(self.n)
        top = top[np.argsort(-sims[top])]
        return self.ids[top].copy(), sims[top]

    def vectors(self, ids: Sequence[int]) -> np.ndarray:
        return self.vecs[[self.pos[i] for i in ids]].copy()

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[: self.n].copy(), self.vecs[: self.n].copy()


class _Inverted:
    """faiss inverted-file tier (inner product): ``nlist`` k-means centroids trained on a sample
    of the rows it was built with; every row lives in the list of its nearest centroid. A
    deletion removes the row from its list (a hash map finds it), an addition appends it."""

    def __init__(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        n, dim = vecs.shape
        self.dim = dim
        self.trained_n = n
        self.nlist = int(min(4096, max(64, 4 * math.sqrt(n))))
        rng = np.random.default_rng(n)
        sample = vecs[rng.choice(n, min(n, 20 * self.nlist), replace=False)]
        self.quantizer = faiss.IndexFlatIP(dim)
        self.index = faiss.IndexIVFFlat(self.quantizer, dim, self.nlist, faiss.METRIC_INNER_PRODUCT)
        self.index.cp.min_points_per_centroid = 1  # the sample may be under faiss's 39 per list
        self.index.cp.niter = 8
        self.index.train(np.ascontiguousarray(sample))
        self.index.set_direct_map_type(faiss.DirectMap.Hashtable)
        self.index.nprobe = min(IVF_NPROBE, self.nlist)
        self.add(ids, vecs)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def add(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        self.index.add_with_ids(np.ascontiguousarray(vecs, dtype=np.float32), np.asarray(ids, dtype=np.int64))

    def remove(self, entry_id: int) -> bool:
        return bool(self.index.remove_ids(np.array([entry_id], dtype=np.int64)))

    def search(self, vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        sims, ids = self.index.search(np.ascontiguousarray(vec[None, :], dtype=np.float32), k)
        keep = ids[0] >= 0
        return ids[0][keep], sims[0][keep]

    def vectors(self, ids: Sequence[int]) -> np.ndarray:
        return np.vstack([self.index.reconstruct(int(i)) for i in ids])

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        lists = self.index.invlists
        all_ids, all_vecs = [], []
        for li in range(self.nlist):
            size = lists.list_size(li)
            if size:
                all_ids.append(faiss.rev_swig_ptr(lists.get_ids(li), size).copy())
                codes = faiss.rev_swig_ptr(lists.get_codes(li), size * self.dim * 4)
                all_vecs.append(np.frombuffer(codes, dtype=np.float32).reshape(size, self.dim).copy())
        if not all_ids:
            return np.zeros(0, dtype=np.int64), np.zeros((0, self.dim), dtype=np.float32)
        return np.concatenate(all_ids), np.vstack(all_vecs)


def _build_tier(ids: np.ndarray, vecs: np.ndarray, dim: int) -> _Exact | _Inverted:
    if len(ids) > EXACT_MAX_ROWS:
        return _Inverted(ids, vecs)
    tier = _Exact(dim)
    tier.add(ids, vecs)
    return tier


# --- Background work -----------------------------------------------------------------------------------


def _start_background(target: Callable[[], None], name: str) -> None:
    """Run ``target`` in a daemon thread with its own database connection, closed at the end
    (tests replace this function to run ``target`` in their thread, or to hold it)."""

    def run() -> None:
        close_old_connections()
        try:
            target()
        finally:
            connection.close()

    threading.Thread(target=run, name=name, daemon=True).start()


# --- One scope -----------------------------------------------------------------------------------------


@dataclass
class SearchResult:
    """The nearest rows of one search, closest first: ``ids`` entry ids, ``sims`` their cosines
    (float, -1..1), ``questions`` their questions, ``vectors`` ``(len(ids), dim)`` float32."""

    ids: list[int]
    sims: list[float]
    questions: list[str]
    vectors: np.ndarray


@dataclass
class _Rebuild:
    ops: list[tuple[str, object]] = field(default_factory=list)


class ScopeIndex:
    """One scope's rows. ``keys``: exact key hash -> entry id of every row held (also rows whose
    vector has another dimension, which a model swap leaves: they are kept out of the search);
    ``dim``: the vectors' dimension (0 until the first row). ``len(index)``: rows searched.
    ``loading``: a background load is filling the scope's real index (this one is an empty
    stand-in: every semantic lookup misses until it is swapped in).

    All public methods are thread-safe (one lock); :meth:`search` never waits on a rebuild."""

    def __init__(self, scope: str, *, loading: bool = False) -> None:
        self.scope = scope
        self.loading = loading
        self.dim = 0
        self.keys: dict[str, int] = {}
        self._meta: dict[int, tuple[str, str]] = {}  # id -> (question, key_hash), vector or not
        self._tier: _Exact | _Inverted | None = None
        self._rebuild: _Rebuild | None = None  # set while a background rebuild of the tier runs
        self._lock = threading.Lock()

    def __len__(self) -> int:
        tier = self._tier
        return len(tier) if tier is not None else 0

    @property
    def kind(self) -> str:
        """``"exact"``, ``"ivf"`` or ``"empty"``: the tier that answers searches now."""
        tier = self._tier
        return "empty" if tier is None else "exact" if isinstance(tier, _Exact) else "ivf"

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._meta

    def add_rows(self, rows: Iterable[Row]) -> int:
        """Add rows ``(id, question, embedding bytes, key_hash)``, in any order; rows already
        held are skipped (so replaying a change is harmless). Returns how many were added."""
        with self._lock:
            ids, vecs = self._add_meta(rows)
            if ids:
                self._add_vectors(np.asarray(ids, dtype=np.int64), np.vstack(vecs))
            return len(ids)

    def _add_meta(self, rows: Iterable[Row]) -> tuple[list[int], list[np.ndarray]]:
        ids: list[int] = []
        vecs: list[np.ndarray] = []
        for entry_id, question, blob, key_hash in rows:
            entry_id = int(entry_id)
            if entry_id in self._meta:
                continue
            self._meta[entry_id] = (question, key_hash)
            self.keys[key_hash] = entry_id
            vec = np.frombuffer(bytes(blob), dtype=np.float32)
            if self.dim == 0:
                self.dim = vec.shape[0]
            if vec.shape[0] == self.dim:
                ids.append(entry_id)
                vecs.append(vec)
        return ids, vecs

    def _add_vectors(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        if self._tier is None:
            self._tier = _build_tier(ids, vecs, self.dim)
        else:
            self._tier.add(ids, vecs)
        if self._rebuild is not None:
            self._rebuild.ops.append(("add", (ids, vecs)))
        self._maybe_rebuild()

    def remove(self, entry_ids: Iterable[int]) -> int:
        """Delete entries (ids not held are ignored); returns how many were held. O(dim) each."""
        n = 0
        with self._lock:
            for entry_id in entry_ids:
                entry_id = int(entry_id)
                meta = self._meta.pop(entry_id, None)
                if meta is None:
                    continue
                n += 1
                if self.keys.get(meta[1]) == entry_id:
                    del self.keys[meta[1]]
                if self._tier is not None:
                    self._tier.remove(entry_id)
                if self._rebuild is not None:
                    self._rebuild.ops.append(("remove", entry_id))
        return n

    def clear(self) -> None:
        """Forget every row (the scope was purged); the object stays the scope's index."""
        with self._lock:
            self._meta.clear()
            self.keys.clear()
            self._tier = None
            if self._rebuild is not None:
                self._rebuild.ops.append(("clear", None))

    def search(self, vec: np.ndarray, k: int) -> SearchResult:
        """The ``k`` rows nearest to ``vec`` (shape ``(dim,)``, float32, unit norm; raises
        ``ValueError`` when ``dim`` differs from the index's), closest first; fewer when the
        scope has fewer (or the inverted file found fewer in the lists it probed)."""
        vec = np.asarray(vec, dtype=np.float32).reshape(-1)
        with self._lock:
            tier = self._tier
            if tier is None or len(tier) == 0:
                return SearchResult([], [], [], np.zeros((0, max(self.dim, vec.shape[0])), dtype=np.float32))
            if vec.shape[0] != self.dim:
                raise ValueError(f"query dimension {vec.shape[0]} differs from the index's {self.dim}")
            ids, sims = tier.search(vec, k)
            id_list = [int(i) for i in ids]
            return SearchResult(
                ids=id_list,
                sims=[float(s) for s in sims],
                questions=[self._meta[i][0] for i in id_list],
                vectors=tier.vectors(id_list) if id_list else np.zeros((0, self.dim), dtype=np.float32),
            )

    # --- Tier rebuilds (from memory, in the background) ---

    def _maybe_rebuild(self) -> None:
        """Called with the lock held after additions: past EXACT_MAX_ROWS the exact tier gives way
        to an inverted file; an inverted file that grew fourfold since its training is retrained."""
        tier = self._tier
        if self._rebuild is not None or tier is None:
            return
        if isinstance(tier, _Exact):
            if len(tier) <= EXACT_MAX_ROWS:
                return
        elif len(tier) <= 4 * tier.trained_n:
            return
        self._rebuild = _Rebuild()
        ids, vecs = tier.snapshot()
        _start_background(lambda: self._rebuild_tier(ids, vecs), f"kefu-index-build:{self.scope[:40]}")

    def _rebuild_tier(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        t0 = time.perf_counter()
        try:
            new = _build_tier(ids, vecs, self.dim)
        except Exception:  # a background thread's edge: log it, keep serving the old tier
            log.exception("cache index: rebuilding scope %s failed", self.scope)
            with self._lock:
                self._rebuild = None
            return
        with self._lock:
            rebuild, self._rebuild = self._rebuild, None
            cleared = False
            for op, arg in rebuild.ops if rebuild is not None else []:
                if op == "add":
                    add_ids, add_vecs = cast(tuple[np.ndarray, np.ndarray], arg)
                    new.add(add_ids, add_vecs)
                elif op == "remove":
                    new.remove(int(arg))  # type: ignore[call-overload]
                else:
                    cleared = True
                    new = _Exact(self.dim)
            self._tier = None if cleared and len(new) == 0 else new
        log.info(
            "cache index: scope %s rebuilt as %s with %d rows in %.1f s",
            self.scope,
            self.kind,
            len(self),
            time.perf_counter() - t0,
        )


# --- Every scope, and the change log -------------------------------------------------------------------


@dataclass
class _Cursor:
    """Where this process is in the change log: ``last_id`` the highest id applied (``None``
    before the first read), ``gaps`` ids below it not seen yet -> ``time.monotonic()`` they were
    first missed, ``checked_at`` / ``read_at`` monotonic times of the last check / successful read."""

    last_id: int | None = None
    gaps: dict[int, float] = field(default_factory=dict)
    checked_at: float = -math.inf
    read_at: float = -math.inf


_indexes: dict[str, ScopeIndex] = {}
_loading: dict[str, list[tuple[str, object]]] = {}  # scope -> changes seen while its load runs
_cursor = _Cursor()
_apply_lock = threading.RLock()  # one applier of changes at a time: refresh, remember, discard, swap
_stats = {"full_loads": 0, "lookup_path_loads": 0, "background_loads": 0, "refreshes": 0, "changes": 0}


def stats() -> dict[str, int]:
    """Counters since start (or :func:`forget`): ``full_loads`` scope loads from the database,
    ``lookup_path_loads`` those made on a lookup (small scopes on first use only),
    ``background_loads`` those made in a background thread, ``refreshes`` change-log reads,
    ``changes`` change-log rows applied."""
    return dict(_stats)


def _init_cursor(now: float) -> None:
    last = CacheChange.objects.aggregate(m=Max("id"))["m"]
    _cursor.last_id, _cursor.gaps, _cursor.read_at, _cursor.checked_at = int(last or 0), {}, now, now


def scope_index(scope: str) -> ScopeIndex:
    """The scope's index, after at most one refresh from the change log (when the last was more
    than ``KEFU_CACHE_INDEX_REFRESH_MS`` ago): other workers' additions, deletions and purges are
    applied incrementally. A scope seen for the first time is loaded here when it holds up to
    :data:`SYNC_LOAD_MAX_ROWS` rows, else in a background thread (an empty stand-in answers
    meanwhile). Synchronous (ORM)."""
    refresh_if_due()
    idx = _indexes.get(scope)
    if idx is None:
        idx = _open(scope)
    return idx


def refresh_if_due() -> None:
    """:func:`refresh` when the last was more than ``KEFU_CACHE_INDEX_REFRESH_MS`` ago (one time
    comparison otherwise). Synchronous (ORM)."""
    now = time.monotonic()
    if now - _cursor.checked_at >= cache_config().index_refresh_s:
        refresh(now=now)


def _load_rows(scope: str, *, limit: int | None = None) -> list[Row]:
    qs = CachedAnswer.objects.filter(scope=scope, embedding__isnull=False).order_by("id").values_list(*_INDEX_COLUMNS)
    return list(qs[:limit] if limit is not None else qs.iterator(chunk_size=5000))


def _open(scope: str) -> ScopeIndex:
    with _apply_lock:
        idx = _indexes.get(scope)
        if idx is not None:
            return idx
        if _cursor.last_id is None:
            _init_cursor(time.monotonic())  # before the snapshot: later changes are replayed onto it
        rows = _load_rows(scope, limit=SYNC_LOAD_MAX_ROWS + 1)
        if len(rows) <= SYNC_LOAD_MAX_ROWS:
            idx = ScopeIndex(scope)
            idx.add_rows(rows)
            _stats["full_loads"] += 1
            _stats["lookup_path_loads"] += 1
            _indexes[scope] = idx
            return idx
        idx = ScopeIndex(scope, loading=True)
        _indexes[scope] = idx
        _reload_in_background(scope)
        return idx


def load(scope: str) -> ScopeIndex:
    """Load the scope from the database in this thread and install its index, replacing any:
    a warm-up at start (so that a large scope's first lookups do not miss) and benchmarks.
    Synchronous (ORM); at 100,000 rows about a second plus the inverted file's training."""
    with _apply_lock:
        if _cursor.last_id is None:
            _init_cursor(time.monotonic())
    idx = build(scope, _load_rows(scope))
    _stats["full_loads"] += 1
    return idx


def build(scope: str, rows: Iterable[Row]) -> ScopeIndex:
    """Build the scope's index from ``rows`` in this thread (ids distinct) and install it,
    replacing any: for a warm-up at start, benchmarks and tests. Returns it."""
    idx = _build_index(scope, rows)
    with _apply_lock:
        _indexes[scope] = idx
    return idx


def _build_index(scope: str, rows: Iterable[Row]) -> ScopeIndex:
    idx = ScopeIndex(scope)
    with idx._lock:
        ids, vecs = idx._add_meta(rows)
        if ids:
            idx._tier = _build_tier(np.asarray(ids, dtype=np.int64), np.vstack(vecs), idx.dim)
    return idx


def _reload_in_background(scope: str) -> None:
    """Load the scope from the database in a thread; the current index serves meanwhile and the
    changes applied to it in between are replayed onto the new one before the swap."""
    with _apply_lock:
        if scope in _loading:
            return
        _loading[scope] = []

    def load() -> None:
        try:
            new = _build_index(scope, _load_rows(scope))
        except Exception:  # a background thread's edge: log it, keep serving the old index
            log.exception("cache index: loading scope %s failed", scope)
            with _apply_lock:
                _loading.pop(scope, None)
            return
        with _apply_lock:
            for op, arg in _loading.pop(scope, []):
                _apply_op(new, op, arg)
            _indexes[scope] = new
            _stats["full_loads"] += 1
            _stats["background_loads"] += 1
        log.info("cache index: scope %s loaded in the background (%d rows, %s)", scope, len(new), new.kind)

    _start_background(load, f"kefu-index-load:{scope[:40]}")


def _apply_op(idx: ScopeIndex, op: str, arg: object) -> None:
    if op == "add":
        idx.add_rows(arg)  # type: ignore[arg-type]
    elif op == "remove":
        idx.remove(arg)  # type: ignore[arg-type]
    else:
        idx.clear()


def _apply(scope: str, op: str, arg: object) -> None:
    """Apply a change to the scope's index (if this process holds one) and remember it for a load
    in flight."""
    with _apply_lock:
        idx = _indexes.get(scope)
        if idx is not None:
            _apply_op(idx, op, arg)
        pending = _loading.get(scope)
        if pending is not None:
            pending.append((op, arg))


def refresh(*, now: float | None = None) -> int:
    """Read the change log after this process's cursor and apply it to the indexes held;
    returns the number of change rows read (0 when another thread is refreshing). Synchronous
    (ORM): at most two queries (the changes; the vectors of added entries, 500 ids a query)."""
    now = time.monotonic() if now is None else now
    if not _apply_lock.acquire(blocking=False):
        return 0
    try:
        _cursor.checked_at = now
        if _cursor.last_id is None:
            _init_cursor(now)
            return 0
        if now - _cursor.read_at > 0.8 * CHANGE_LOG_RETENTION_S:
            # Trimmed rows may have been missed: reload every scope off the lookup path.
            log.warning(
                "cache index: change log not read for %.0f s, reloading %d scope(s)",
                now - _cursor.read_at,
                len(_indexes),
            )
            for scope in list(_indexes):
                _reload_in_background(scope)
            _init_cursor(now)
            return 0
        _stats["refreshes"] += 1
        for gap, since in list(_cursor.gaps.items()):
            if now - since > GAP_TIMEOUT_S:
                del _cursor.gaps[gap]
        cond = Q(id__gt=_cursor.last_id)
        if _cursor.gaps:
            cond |= Q(id__in=list(_cursor.gaps))
        changes = list(
            CacheChange.objects.filter(cond)
            .order_by("id")
            .values_list("id", "scope", "entry_id", "kind")[:CHANGES_PER_REFRESH]
        )
        if len(changes) == CHANGES_PER_REFRESH:
            _cursor.checked_at = -math.inf  # more to read: the next lookup reads on
        _advance(changes, now)
        _cursor.read_at = now
        _drop_from_hot_layer(changes)
        wanted = [c for c in changes if c[1] in _indexes or c[1] in _loading]
        _stats["changes"] += len(wanted)
        added = [int(c[2]) for c in wanted if c[3] == CacheChange.Kind.ADD and c[2] is not None]
        rows: dict[int, Row] = {}
        for i in range(0, len(added), 500):
            for row in CachedAnswer.objects.filter(id__in=added[i : i + 500], embedding__isnull=False).values_list(
                *_INDEX_COLUMNS
            ):
                rows[int(row[0])] = row
        for _id, scope, entry_id, kind in wanted:
            if kind == CacheChange.Kind.ADD:
                row = rows.get(int(entry_id)) if entry_id is not None else None
                if row is not None:  # no row: deleted since (its delete is in the log too)
                    _apply(scope, "add", [row])
            elif kind == CacheChange.Kind.DELETE and entry_id is not None:
                _apply(scope, "remove", [int(entry_id)])
            elif kind == CacheChange.Kind.PURGE:
                _apply(scope, "clear", None)
        return len(changes)
    finally:
        _apply_lock.release()


def _drop_from_hot_layer(changes: Sequence[tuple[int, str, int | None, str]]) -> None:
    """The backstop of ``cache_layer.hot``: deletions and purges in the change log drop their
    entries from the hot layer too, whatever scopes this process has indexed (an announcement
    through Redis may have failed)."""
    hot = current_hot_layer()
    if hot is None:
        return
    deleted = [int(c[2]) for c in changes if c[3] == CacheChange.Kind.DELETE and c[2] is not None]
    if deleted:
        hot.drop_ids(deleted)
    for c in changes:
        if c[3] == CacheChange.Kind.PURGE:
            hot.drop_scope(c[1])


def _advance(changes: Sequence[tuple[int, str, int | None, str]], now: float) -> None:
    """Move the cursor past ``changes`` (ordered by id); ids skipped below the new last id are
    gaps (a transaction not committed yet, or one rolled back)."""
    assert _cursor.last_id is not None
    last = _cursor.last_id
    for change_id, *_ in changes:
        _cursor.gaps.pop(change_id, None)
        if change_id > last:
            if change_id > last + 1 and change_id - last <= 10_000:
                for missing in range(last + 1, change_id):
                    _cursor.gaps[missing] = now
            last = change_id
    _cursor.last_id = last


def remember(scope: str, entry_id: int, question: str, vec: np.ndarray, key_hash: str) -> None:
    """This process stored an entry (committed): add it to the scope's index now, without a
    query. ``vec``: shape ``(dim,)`` float32 unit vector. Its change-log row is skipped later."""
    _apply(scope, "add", [(int(entry_id), question, np.asarray(vec, dtype=np.float32).tobytes(), key_hash)])


def discard(scope: str, entry_ids: Sequence[int]) -> None:
    """This process deleted entries of ``scope`` (committed): drop them from its index, O(dim) each."""
    if entry_ids:
        _apply(scope, "remove", [int(i) for i in entry_ids])


def clear(scopes: Sequence[str]) -> None:
    """Every entry of these scopes was deleted (committed): empty their indexes."""
    for scope in scopes:
        _apply(scope, "clear", None)


def forget(scopes: Sequence[str] | None = None) -> None:
    """Drop in-process indexes (all, or the given scopes; all also resets the change-log cursor
    and :func:`stats`); they load again at their next lookup. For tests and benchmarks: no
    change to the cache calls it."""
    with _apply_lock:
        if scopes is None:
            _indexes.clear()
            _loading.clear()
            _cursor.last_id, _cursor.gaps = None, {}
            _cursor.checked_at = _cursor.read_at = -math.inf
            for k in _stats:
                _stats[k] = 0
        else:
            for s in scopes:
                _indexes.pop(s, None)
