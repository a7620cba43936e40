"""The standard config sections every recipe shares; a recipe's config subclasses ``RecipeConfig``.

Names follow fairseq2's habits so that its users find their keys where they expect them.
Every number declares its valid range in its type (``recipes.config.resolution.Range``), checked as the
config resolves, so that a bad value is a clear error naming its key before any work starts;
``__post_init__`` keeps only what a range cannot say (two fields together, a list's length).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from components import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, Range
from recipes.lr_schedules import LR_SCHEDULES, LRScheduleConfig
from recipes.optimizers import OPTIMIZERS, OptimizerConfig
from recipes.recorders.base import RECORDERS, RecorderConfig, built_in_recorders

Seed = Annotated[int, Range(ge=0, le=2**32 - 1)]
"""What ``numpy.random.seed`` takes, which every seed reaches."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass
class EarlyStoppingSection:
    patience: PositiveInt | None = None
    """Stop after this many validations without improvement of the score; ``None``: never."""
    min_delta: NonNegativeFloat = 0.0
    """The least change of the score that counts as an improvement."""


@dataclass
class TrainerSection:
    max_num_steps: PositiveInt | None = 1000
    """Stop after this many optimizer steps; ``None``: no limit (then set ``max_num_data_epochs``)."""
    max_num_data_epochs: PositiveInt | None = None
    """Stop after this many passes over the training data; ``None``: no limit."""
    max_num_windows: PositiveInt | None = None
    """With data in windows (``dataset.windows``), stop after training on this many windows (RecIS'
    ``window_iter``); ``None``: at the end of the data (never, when the reader follows new windows)."""
    grad_accumulation: PositiveInt = 1
    """Micro-batches per optimizer step."""
    max_grad_norm: PositiveFloat | None = None
    """Clip the dense parameters' gradient norm to this, recorded before clipping as ``grad_norm``; ``None``: no
    clipping, and no norm taken (set a large value to watch the norm without clipping). The sparse tables' gradients
    are neither clipped nor counted in the norm: their rows take their own optimizer's steps."""
    mixed_precision: Literal["none", "bf16", "fp16"] = "none"
    """Autocast dtype; ``fp16`` adds a dynamic loss scaler."""
    anomaly_detection: bool = False
    """Run autograd's anomaly detection (slow; for debugging NaNs)."""
    validate_every_n_steps: PositiveInt | None = None
    """Validate every N steps (and at the end); ``None``: only at the end."""
    validate_every_n_data_epochs: PositiveInt | None = None
    """Validate also after every N passes over the training data (at the first step of the next one), so that a
    small file is validated as often as its epochs end and a large one every ``validate_every_n_steps``."""
    publish_metrics_every_n_steps: PositiveInt = 10
    """Write metrics to the recorders every N steps (and at the end)."""
    score_metric: str | None = None
    """The validation metric that scores a checkpoint, as ``metric`` or ``eval_unit/metric``. It must have a better
    side (an AUC, a loss; not ``calibration`` or ``positive_rate``), and a score that is NaN (an AUC of a split of
    one class) stops the run at that validation."""
    lower_better: bool | None = None
    """Whether a lower score is better (a loss) or a higher one (an AUC). ``None``: as the score's metric says (a
    run's ``config.yaml`` records what that was); set it only for a metric that does not say (a ``Mean``). A value
    that contradicts the metric is refused."""
    nan_policy: Literal["stop", "skip"] = "stop"
    """On a NaN or infinite loss: ``stop`` with an error naming the step, or ``skip`` the step."""
    max_consecutive_skipped_steps: PositiveInt = 5
    """With ``nan_policy: skip``, stop after this many non-finite steps in a row."""
    early_stopping: EarlyStoppingSection = field(default_factory=EarlyStoppingSection)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: this rank's CUDA device if there is one, else the CPU."""
    pipeline: bool | Literal["auto"] = "auto"
    """Read the next step, and send its sparse ids to their tables' owners, while a step computes
    (``recipes.training.pipeline``); the results are the same either way. ``auto``: on a GPU, with tables stored on
    disk (their rows are read ahead too), and on a CPU where the pipeline's thread has a core of its own (the
    ranks' compute threads leave one of the node's cores) or the job spans several nodes; on a CPU whose cores the
    step's threads take, its thread would make every parallel region of the step wait for it (docs/benchmarks.md,
    "Training on a shared machine")."""
    keep_freed_memory: bool = True
    """Have glibc's malloc keep freed host memory (up to 1 GiB) for the next step rather than give it back
    to the system, for the step to fault it in again (``recipes.runtime.host_memory``; DLRM at batch 8192: 1.10x the
    steps/s on one rank, 1.21x on two). glibc's own ``MALLOC_*_`` variables or ``GLIBC_TUNABLES``, when set, win."""

    def __post_init__(self) -> None:
        _require(
            self.max_num_steps is not None or self.max_num_data_epochs is not None or self.max_num_windows is not None,
            "`max_num_steps` and `max_num_data_epochs` must not both be null, or training never ends "
            "(unless `max_num_windows` is set, for data in windows).",
        )


@dataclass
class MetricsSection:
    recorders: Annotated[dict[str, RecorderConfig], RECORDERS] = field(default_factory=built_in_recorders)
    """Where metrics go, by recorder name: ``tensorboard``, ``jsonl`` and ``console`` (a progress bar with step,
    loss, throughput and ETA, and a line per validation) are on, ``wandb`` off; ``console: false`` turns one off,
    ``wandb: {enabled: true, project: P}`` one on with its options."""
    group_by: str | None = None
    """A column whose values group the validation rows (the user id): adds ``gauc``, the AUC within each group
    averaged with the groups' rows as weights (groups of one class left out), and ``gauc_groups``, how many
    groups it counts. The recipe checks that its batches hold the column."""
    slice_by: str | None = None
    """A column of few values (at most 1,000: device type, hour) whose values slice the validation rows: adds
    ``ne/<value>`` and ``calibration/<value>`` per value. The recipe checks that its batches hold the column."""


@dataclass
class ProfilerSection:
    enabled: bool = False
    """Record torch.profiler traces under ``OUTPUT_DIR/tb/profiler``."""
    skip_steps: NonNegativeInt = 5
    """Steps to run before profiling starts (warm-up is not what you want to see)."""
    record_steps: PositiveInt = 3
    """Steps recorded once profiling starts."""


@dataclass
class ModelBankSource:
    """One source of ``checkpoint.model_bank``: which parameters and tables of another run to load, and as what."""

    path: str = ""
    """Another run's output directory, its ``checkpoints`` directory, or one ``step_N`` of it; a directory is
    read at its newest intact checkpoint each time the source loads."""
    load: list[str] = field(default_factory=lambda: ["*"])
    """Glob patterns of the source's parameter names (``mlp.0.weight``) and tables (``embeddings.cat_0``) to load;
    each must match something unless ``ignore_missing``."""
    exclude: list[str] = field(default_factory=list)
    """Glob patterns of names (the source's) to leave out."""
    rename: dict[str, str] = field(default_factory=dict)
    """Old prefix -> new prefix: a source name's longest matching prefix is replaced to give this model's name."""
    reset_tables: list[str] = field(default_factory=list)
    """Glob patterns of this model's hash tables to clear before they load: only the source's ids remain."""
    ignore_missing: bool = False
    """Warn about, rather than refuse, patterns that match nothing and names the model lacks or shapes it lacks."""

    def __post_init__(self) -> None:
        _require(bool(self.path), "`path` must name a run or checkpoint of the model bank, but is empty.")


@dataclass
class CheckpointSection:
    every_n_steps: PositiveInt | None = None
    """Save every N steps; a final checkpoint is always saved at the end of training."""
    every_n_data_epochs: PositiveInt | None = None
    """Save at the end of every N passes over the training data."""
    every_n_windows: PositiveInt | None = None
    """With data in windows, save after every N windows (RecIS' ``save_every_n_windows``), before the next one
    is waited for or scored."""
    keep_last_n: PositiveInt | None = None
    """Keep the N newest checkpoints; without ``keep_best_n`` an older, better one is deleted too, and ``best`` (and
    ``auto``, for ``eval``, ``predict``, ``export``) is then the best of the N kept. With no keep policy at all every
    checkpoint is kept; with several, a checkpoint is kept if any policy keeps it, and the newest (and the newest
    resumable) checkpoint is never deleted."""
    keep_best_n: PositiveInt | None = None
    """Keep the N best by validation score (``trainer.score_metric``, ``trainer.lower_better``); a validation that
    beats the best so far is checkpointed at once, between the ``every_n_*`` periods too, so that the best
    checkpoint is the best validation."""
    keep_every_n_steps: PositiveInt | None = None
    """Keep checkpoints whose step is a multiple of N."""
    full_every: PositiveInt = 1
    """Save the sparse tables whole in every Nth checkpoint only; the checkpoints between hold each table's rows
    changed since the last whole one (a delta: a few percent of a big table's bytes under skewed ids), and need it
    to be read, so the keep policies keep it as long as they keep any of them. A resumed run saves whole first.
    Tables stored off the device (``storage``) are always saved whole. 1: every checkpoint whole (the default:
    each checkpoint stands alone, which tools that copy or read one checkpoint directory expect)."""
    model_only: Literal["none", "all", "all_but_last"] = "none"
    """Save only the model (not resumable): for every checkpoint, or all but the newest."""
    async_save: bool = False
    """Write checkpoints in a background thread while training goes on; parameters and optimizer state are copied
    to CPU there too, before the next optimizer step (a unit that changes parameters elsewhere must leave this
    off)."""
    init_from: str | None = None
    """Initialise the model from another checkpoint (a step dir, or a checkpoints dir: its last)."""
    init_include: list[str] = field(default_factory=lambda: ["*"])
    """Glob patterns of parameter names to take from ``init_from``."""
    init_exclude: list[str] = field(default_factory=list)
    """Glob patterns of parameter names of ``init_from`` to leave out."""
    init_strict: bool = True
    """Every parameter selected from ``init_from`` must exist with the same shape on both sides."""
    start_over: bool = False
    """Ignore (and move aside) the output directory's checkpoints and train from scratch."""
    model_bank: list[ModelBankSource] = field(default_factory=list)
    """Other runs' parameters and tables to load at the start (``init_from`` is one more, loaded first) and every
    ``reload_every_n_*`` (``recipes.checkpointing.model_bank``)."""
    reload_every_n_steps: PositiveInt | None = None
    """Reload every model-bank source from its newest intact checkpoint every N steps; ``None``: never."""
    reload_every_n_data_epochs: PositiveInt | None = None
    """Reload every model-bank source after every N passes over the training data; ``None``: never."""
    reload_every_n_windows: PositiveInt | None = None
    """Reload every model-bank source after every N data windows (``dataset.windows``), before the next window is
    scored and trained on; ``None``: never."""
    exclude: list[str] = field(default_factory=list)
    """Glob patterns of parameters (``mlp.0.weight``) and tables (``embeddings.cat_0``) left out of checkpoints; a
    resume re-initialises them."""

    def __post_init__(self) -> None:
        reloads = self.reload_every_n_steps is not None or self.reload_every_n_data_epochs is not None
        _require(
            not reloads or bool(self.model_bank) or self.init_from is not None,
            "`reload_every_n_steps`/`reload_every_n_data_epochs` must come with a `model_bank` source to reload, "
            "but there is none.",
        )


@dataclass
class GangSection:
    tp_size: PositiveInt = 1
    """Tensor-parallel degree; the data-parallel degree is the world size divided by it."""
    timeout_s: Annotated[float, Range(gt=0, le=30 * 86400)] = 300.0
    """How long a collective may wait for a peer before the job fails."""
    threads_per_rank: PositiveInt | None = None
    """Threads of torch and numba in each rank, at most the cores this process may run on (checked at start-up:
    more only wait for each other); ``None``: those cores divided by the ranks on its node."""


@dataclass
class ValidationSection:
    batch_size: PositiveInt | None = None
    """The global batch size of validation, ``eval`` and ``predict``; ``None``: the training one.
    Every row is scored whatever it is, so it changes speed and memory, not the metrics."""


@dataclass
class RecipeConfig:
    """The sections every recipe has. A recipe adds its own (``model``, ``dataset``, ...)."""

    seed: Seed = 2
    """The seed of Python's, numpy's and torch's RNGs and of the data's shuffling."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    optimizer: Annotated[OptimizerConfig, OPTIMIZERS] = field(default_factory=OPTIMIZERS.default("adamw"))
    lr_scheduler: Annotated[LRScheduleConfig, LR_SCHEDULES] = field(default_factory=LR_SCHEDULES.default("constant"))
    metrics: MetricsSection = field(default_factory=MetricsSection)
    profiler: ProfilerSection = field(default_factory=ProfilerSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    gang: GangSection = field(default_factory=GangSection)
    validation: ValidationSection = field(default_factory=ValidationSection)
