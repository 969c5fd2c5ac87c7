"""The batched engine's counters: where a step's time goes (``PHASES``, ``EngineStats``) and a
snapshot of its load (``EngineLoad``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the phases of a step whose time ``EngineStats.phase_seconds`` adds up: admitting rows, proposing
#: (drafts included), the target forward, waiting for masks the forward did not hide, masking and
#: choosing tokens (and reading them back), verifying and committing row by row, and what follows
#: a commit (stop strings, callbacks, ending rows)
PHASES = ("schedule", "propose", "forward", "masks", "sample", "commit", "stream")


@dataclass
class EngineStats:
    """Engine-wide counters: steps, rows per step, how much mask time the forward hid, and where
    a step's time goes (``phase_seconds``, by ``PHASES``)."""

    steps: int = 0
    rows_stepped: int = 0
    positions: int = 0
    forward_seconds: float = 0.0
    prefill_seconds: float = 0.0
    mask_seconds: float = 0.0
    mask_wait_seconds: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def mask_hidden_share(self) -> float:
        """The share of mask computation that ran while the forward pass did."""
        if self.mask_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - self.mask_wait_seconds / self.mask_seconds)

    def as_dict(self) -> dict[str, Any]:
        """The counters and their means, rounded, as JSON-ready values."""
        return {"steps": self.steps, "mean_rows": round(self.rows_stepped / self.steps, 3) if self.steps else 0.0,
                "mean_width": round(self.positions / self.rows_stepped, 3) if self.rows_stepped else 0.0,
                "forward_seconds": round(self.forward_seconds, 4), "prefill_seconds": round(self.prefill_seconds, 4),
                "decode_step_ms": round(1000 * (self.forward_seconds - self.prefill_seconds) / self.steps, 2)
                if self.steps else 0.0, "mask_seconds": round(self.mask_seconds, 4),
                "mask_wait_seconds": round(self.mask_wait_seconds, 4),
                "mask_hidden_share": round(self.mask_hidden_share, 4)}


@dataclass(frozen=True)
class EngineLoad:
    """What the engine is doing now: rows decoding and waiting, and its bounds."""

    running_rows: int
    waiting_rows: int
    max_batch_size: int
    mean_rows_per_step: float
    """Rows per target forward since the engine started."""
    prefix_cache_bytes: int = 0
    """Keys and values of stored prompt prefixes (bounded by the runner's ``prefix_cache_bytes``)."""
    steps: int = 0
    """Target forwards (batched steps) since the engine started."""
    forward_seconds: float = 0.0
    """Time in those forwards, prefill included."""
    prefill_seconds: float = 0.0
    """Time in them spent in prefill passes of their own (a padded runner's joining rows; a ragged
    runner prefills within the step and only computes shared prompt prefixes apart)."""
    prefill_positions: int = 0
    """Prompt positions those forwards computed (not copied from the prefix cache)."""
    attended_valid_share: float = 1.0
    """Of the KV slots the step passes' attention read, the share holding a row's own token (the
    rest: a padded runner's left padding and holes, a ragged runner's shorter rows and spare
    positions)."""
    compiled_steps: int = 0
    """Of those forwards, the ones run through ``torch.compile`` (``models.compiled``)."""
    compiled_active: bool = False
    """Whether the forwards run compiled now (compiled, and no failure sent them back to eager)."""
    runner_fallback: str | None = None
    """Why the target runs on the padded runner although the ragged one was wanted (the ragged
    runner failed its load-time self-check: ``models.self_check``), or None."""
    ragged_runner: bool = False
    """Whether the target runs on the ragged runner or the graph runner (else the padded one)."""
    static_runner: bool = False
    """Whether the target runs on the static-shape ``GraphRunner`` (``runners``)."""
    cuda_graphs: int = 0
    """CUDA graphs the graph runner replays its steps from (0: none captured, or they were dropped)."""
    graph_replays: int = 0
    """Steps replayed from those graphs since start."""
    graphs_off: str | None = None
    """Why the graph runner runs without graphs or without static steps (a failed capture or
    self-check, a row that outgrew its cache), or None."""
    ahead_steps: int = 0
    """Steps whose forward was launched before the read of the step before (``decoding.ahead``)."""
