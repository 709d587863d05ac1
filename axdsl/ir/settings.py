"""Resolved settings: the target's schedule (configure_target) and the train settings
(configure_train), each value with its origin."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from axdsl.errors import Span
from axdsl.ir.origins import Choice


class RematKind(StrEnum):
    NONE = "none"  # keep every activation
    FULL = "full"  # keep only the block's input
    SAVE_DOTS = "save_dots"  # keep matmul outputs without batch dims
    SAVE = "save"  # keep the named points listed
    OFFLOAD = "offload"  # move some named points to host memory, keep others
    FIT = "fit"  # a request, resolved by fit_remat: the least recomputation that fits the chip


@dataclass(frozen=True)
class RematPolicy:
    """How the scanned block is rematerialized: none, full, save_dots, save or offload names."""

    kind: RematKind
    save: tuple[str, ...] = ()
    offload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "kind", RematKind(self.kind)
        )  # "full" is accepted as RematKind.FULL


@dataclass(frozen=True)
class FitTry:
    """One policy fit_remat weighed: its analytic per-chip bytes for the train step."""

    policy: RematPolicy
    bytes: int
    microbatches: int = 1  # the step's gradient-accumulation pieces when it was weighed


@dataclass(frozen=True)
class RematFit:
    """How fit_remat chose the remat policy: what it tried in order (the last one tried is the
    choice, unless nothing fitted), against which per-chip budget and for which step."""

    tried: tuple[FitTry, ...]
    usable: (
        int  # per-chip bytes a chosen step may use (the platform's usable memory, less FIT_MARGIN)
    )
    model: str
    batch: int
    seq: int

    @property
    def fits(self) -> bool:
        """Whether the chosen policy fits (else it is the strongest, and nothing fitted)."""
        return self.tried[-1].bytes <= self.usable

    @property
    def microbatches(self) -> int:
        """The micro-batches chosen with the policy (1: the batch in one piece), when it fits."""
        return self.tried[-1].microbatches if self.fits else self.tried[0].microbatches


class QuantFormat(StrEnum):
    NONE = "none"
    FP8 = "fp8"  # e4m3 forward, e5m2 gradients (H100, H200, B200)
    INT8 = "int8"  # per-channel symmetric, straight-through backward (TPU v5e, v5p)


class Kernel(StrEnum):
    """An implementation of a primitive that select_kernels chooses (the primitive's `KernelRule`
    says which are its own and when each can run; profiles.toml lists them by these names)."""

    XLA = "xla"  # XLA's reference: jax.nn.dot_product_attention or an einsum; runs every call
    CUDNN = "cudnn"  # cuDNN flash attention (GPUs)
    SPLASH = "splash"  # the TPU Pallas splash-attention kernel
    VJP = "vjp"  # attention's einsums with a written-out backward
    DENSE = "dense"  # an einsum `x @ weight` as dense(x, weight)


@dataclass(frozen=True)
class QuantPolicy:
    """Matmuls with a parameter operand under layer paths matching `layers` run in `format`."""

    format: QuantFormat
    layers: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", QuantFormat(self.format))


class ContextStrategy(StrEnum):
    """How attention meets the keys of other shards under context parallelism."""

    ALL_GATHER = "all_gather"  # keys and values gathered once per layer (MaxText's default)
    RING = "ring"  # key/value blocks travel by ppermute with an online softmax: flat memory


@dataclass(frozen=True)
class ContextPolicy:
    """Context parallelism: the sequence split over the `seq` mesh axis, attention run per shard
    inside shard_map. `balance`: the layers run the sequence in zig-zag order, so every shard
    has the same causal work (None until plan_context decides it: true when every attention is
    causal, the only case it changes anything)."""

    strategy: ContextStrategy
    balance: bool | None = None
    shards: int = 0  # the `seq` mesh axis's size; plan_context fills it in


STAGE_AXIS = "stage"  # the mesh axis pipeline stages are laid out on (passes/plan_pipeline.py)


@dataclass(frozen=True)
class PipelinePolicy:
    """Pipeline parallelism: the model's main repeat of layers split into consecutive stages over
    the `stage` mesh axis, the batch cut into `microbatches` that flow through them. With
    `repeats` > 1 the schedule is circular: each stage holds `repeats` blocks of layers and a
    micro-batch passes through the stages that many times (MaxText's circular pipeline).

    plan_pipeline fills in the rest: `stages` (the mesh axis's size), `child` (the instance path
    of the repeat it splits, e.g. "/blocks") and `layers` (each model's count of that repeat's
    layers, by model name)."""

    microbatches: int
    repeats: int = 1
    stages: int = 0
    child: str = ""
    layers: tuple[tuple[str, int], ...] = ()

    @property
    def iterations(self) -> int:
        """Steps of the pipeline loop: every micro-batch through every repeat, then the last
        one's way through the remaining stages."""
        return self.microbatches * self.repeats + self.stages - 1

    @property
    def bubble(self) -> float:
        """The fraction of the loop each stage idles: (stages - 1) / (microbatches * repeats +
        stages - 1), MaxText's formula for its circular pipeline (GPipe's when repeats = 1)."""
        return (self.stages - 1) / self.iterations if self.stages else 0.0

    def layers_per_stage(self, layers: int) -> int:
        """The layers one stage runs in a row (per repeat) out of a repeat of `layers`."""
        return layers // (self.stages * self.repeats)


class XlaFlag(StrEnum):
    """The XLA flags a GPU schedule sets (choose_xla_flags), each one known to jaxlib 0.10.2
    and 0.11.2: XLA aborts the process on a flag it does not know."""

    LATENCY_HIDING_SCHEDULER = "xla_gpu_enable_latency_hiding_scheduler"
    COMMAND_BUFFER = "xla_gpu_enable_command_buffer"
    TRITON_GEMM = "xla_gpu_enable_triton_gemm"
    DISABLE_HLO_PASSES = "xla_disable_hlo_passes"
    ALL_REDUCE_COMBINE_BYTES = "xla_gpu_all_reduce_combine_threshold_bytes"
    ALL_GATHER_COMBINE_BYTES = "xla_gpu_all_gather_combine_threshold_bytes"
    REDUCE_SCATTER_COMBINE_BYTES = "xla_gpu_reduce_scatter_combine_threshold_bytes"
    ALL_GATHER_COMBINE_BY_DIM = "xla_gpu_enable_all_gather_combine_by_dim"
    REDUCE_SCATTER_COMBINE_BY_DIM = "xla_gpu_enable_reduce_scatter_combine_by_dim"
    PIPELINED_ALL_GATHER = "xla_gpu_enable_pipelined_all_gather"
    PIPELINED_REDUCE_SCATTER = "xla_gpu_enable_pipelined_reduce_scatter"
    PIPELINED_ALL_REDUCE = "xla_gpu_enable_pipelined_all_reduce"
    WHILE_LOOP_DOUBLE_BUFFERING = "xla_gpu_enable_while_loop_double_buffering"


@dataclass(frozen=True)
class FlagSetting:
    """One XLA flag with the value a schedule gives it (XLA's text form; "" for an empty list)
    and why, in one line."""

    flag: XlaFlag
    value: str
    reason: str

    @property
    def text(self) -> str:
        """As XLA_FLAGS writes it: `--xla_gpu_enable_triton_gemm=false`."""
        return f"--{self.flag}={self.value}"


class UpdateSkip(StrEnum):
    """How the generated train step skips an update whose loss or gradient is not finite
    (choose_update_skip): both keep the old state bit for bit; they differ in memory by platform."""

    COND = "cond"  # jax.lax.cond(ok, update, keep, ...): only the taken branch runs
    SELECT = "select"  # every leaf jnp.where(ok, new, old): the update always runs, then selects


@dataclass(frozen=True)
class GpuRuntime:
    """What a GPU schedule sets in the environment before jax starts (choose_xla_flags): XLA's
    flags, and the fraction of the HBM XLA's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION)."""

    flags: tuple[FlagSetting, ...]
    mem_fraction: float
    mem_fraction_reason: str


@dataclass(frozen=True)
class Schedule:
    """The schedule for one target: profile defaults overridden by the first matching block."""

    name: str  # as requested, e.g. gpu-h100-8
    profile: str  # e.g. gpu-h100
    kind: ChipKind  # the profile's chip family
    chips: int
    matched: str | None  # the pattern of the target block that matched, if any
    matched_span: Span | None
    mesh: Choice  # value: tuple[(axis, size as written)]; sizes resolved in `mesh_sizes`
    mesh_sizes: tuple[tuple[str, int], ...]
    rules: tuple[tuple[str, Choice], ...]  # logical axis -> Choice(tuple of mesh axes)
    remat: Choice  # value: RematPolicy
    quantize: Choice  # value: QuantPolicy
    kernels: tuple[tuple[str, Choice], ...]  # op -> Choice(Kernel, or None: auto)
    unroll: Choice  # value: int, the most layers a repeat may have and run unrolled (0: never)
    steps_per_call: Choice  # value: int >= 1, train steps one jitted call runs (numerics unchanged)
    remat_fit: RematFit | None = None  # set by fit_remat when it chose `remat` by memory
    # value: ContextPolicy, or None (no context parallelism); balance and shards resolved by
    # plan_context
    context: Choice = Choice(None)
    # value: PipelinePolicy, or None (no pipeline); stages, child and layers resolved by
    # plan_pipeline
    pipeline: Choice = Choice(None)
    # set by annotate_sharding: (model, why) for each model after the spec's first whose
    # parameters this target's mesh does not divide; the target's build leaves them out
    left_out: tuple[tuple[str, str], ...] = ()
    # set by choose_xla_flags on GPU targets (None elsewhere): the XLA flags and memory fraction
    # the generated train.py sets before jax starts
    gpu_runtime: GpuRuntime | None = None
    # set by choose_update_skip: the form of the skip-if-not-finite update that keeps the least
    # memory on this platform (analysis/platforms.py `update_skip`)
    update_skip: UpdateSkip = UpdateSkip.COND

    def unrolls(self, layers: int) -> bool:
        """Whether a repeat of `layers` layers (steps x layers per step) runs unrolled here."""
        limit: int = self.unroll.value
        return 0 < layers <= limit

    def rule(self, logical: str) -> tuple[str, ...]:
        return next((c.value for k, c in self.rules if k == logical), ())

    def rule_choice(self, logical: str) -> Choice | None:
        return next((c for k, c in self.rules if k == logical), None)

    def size(self, mesh_axis: str) -> int:
        return dict(self.mesh_sizes)[mesh_axis]

    def kept_axes(self, logical: str) -> tuple[str, ...]:
        """The mesh axes a logical axis maps to on this target, without the axes written as size 1
        (they shard nothing; the -1 axis is kept, since its size follows the chip count)."""
        written = dict(self.mesh.value)
        return tuple(a for a in self.rule(logical) if written.get(a, 1) != 1)


@dataclass(frozen=True)
class NamedCall:
    """An optimizer, schedule or objective (`name` its OptimizerKind, ScheduleKind or
    ObjectiveKind) with every argument resolved: adamw(lr = 3e-4, b1 = 0.9, ...)."""

    name: OptimizerKind | ScheduleKind | ObjectiveKind
    args: tuple[tuple[str, Any], ...]

    def arg(self, key: str, default: Any = None) -> Any:
        return dict(self.args).get(key, default)


class OptimizerKind(StrEnum):
    """The train block's `optimizer = ...` (axdsl/optim/ holds each one's registry entry: its
    arguments, its state for the memory model, and its optax spelling in train.py)."""

    ADAMW = "adamw"
    LION = "lion"
    ADAFACTOR = "adafactor"
    SGD = "sgd"


class ScheduleKind(StrEnum):
    """The train block's `schedule = ...`, the learning rate by step (axdsl/optim/ holds each
    one's registry entry)."""

    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"
    WSD = "wsd"  # warmup, stable, decay
    RSQRT = "rsqrt"


class ChipKind(StrEnum):
    """A target profile's chip family (targets/profiles.toml's `kind`)."""

    CPU = "cpu"
    GPU = "gpu"
    TPU = "tpu"
    TRN = "trn"


class ObjectiveKind(StrEnum):
    """What train.py minimizes: the train block's `objective = ...` (axdsl/objectives/ holds each
    one's registry entry: its arguments, batches, loss and metrics)."""

    NEXT_TOKEN = "next_token"  # the default: tokens [B, S] -> logits [B, S, vocab]
    MASKED_LM = "masked_lm"  # BERT's masked-LM
    SEQ2SEQ = "seq2seq"  # teacher forcing over (source, target) pairs
    CLASSIFY = "classify"  # images [B, H, W, C] -> logits [B, classes]
    LOSS = "loss"  # the root forward returns the loss itself
    DPO = "dpo"  # direct preference optimization over (chosen, rejected) pairs
    SIMPO = "simpo"  # SimPO: reference-free, length-normalized rewards and a target margin
    ORPO = "orpo"  # ORPO: the chosen answers' NLL plus a log odds-ratio term, reference-free


class TokenWidth(StrEnum):
    """The element type of a token file: the ids are little-endian unsigned integers."""

    U16 = "u16"
    U32 = "u32"

    @property
    def bytes(self) -> int:
        return 2 if self is TokenWidth.U16 else 4


class DataKind(StrEnum):
    DEFAULT = "default"  # the Python standard library's .py files, read as bytes
    TOKENS = "tokens"  # a flat binary file of token ids
    TEXT = "text"  # a text file or a directory of them, read as bytes
    PAIRS = "pairs"  # seq2seq: a source and a target token file, examples ended by an eos id
    ARRAYS = "arrays"  # a .npz file (or a directory of .npy files), one array per input name
    SYNTHETIC_IMAGES = (
        "synthetic_images"  # a learnable image-classification set made on the machine
    )
    SYNTHETIC_PAIRS = (
        "synthetic_pairs"  # a learnable seq2seq set made on the machine (reversed strings)
    )
    CHAT = "chat"  # conversations (jsonl), rendered with a tokenizer's chat template
    PREFERENCES = "preferences"  # (prompt, chosen, rejected) lines (jsonl), rendered like chat


class TrainOn(StrEnum):
    """Which tokens of chat data the loss is taken on (`chat(..., train_on = ...)`)."""

    ASSISTANT = "assistant"  # the assistant turns' contents and their end-of-turn tokens
    ALL = "all"  # every token of each conversation


@dataclass(frozen=True)
class Tokenizer:
    """How text data becomes token ids: a `tokenizer.json` file (HF `tokenizers`) or a byte-level
    BPE trained on the data itself. Without one, text is read as bytes (vocab 256)."""

    path: str | None = None  # a tokenizer.json, relative to the spec's directory
    bpe_vocab: int | None = None  # train a byte-level BPE of this size; 0: the model's vocab


@dataclass(frozen=True)
class DataSource:
    kind: DataKind
    path: str | None = None
    dtype: TokenWidth | None = None  # tokens and pairs: None reads u16
    path2: str | None = None  # pairs: the target token file
    options: tuple[
        tuple[str, Any], ...
    ] = ()  # pairs: eos; synthetic_*: count, (noise,) (eos,) seed
    tokenizer: Tokenizer | None = (
        None  # default, text: None reads bytes; chat, preferences: required
    )
    train_on: TrainOn | None = None  # chat: the tokens the loss is taken on

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)


@dataclass(frozen=True)
class CheckpointPolicy:
    every: int = 100
    keep: int = 3
    async_save: bool = True
    dir: str = "checkpoints"


@dataclass(frozen=True)
class TrainSettings:
    """The resolved `train { }` section: every setting with its value and where it came from.

    Values are ints and floats, a dtype name (dtype, param_dtype), NamedCall (optimizer,
    schedule), DataSource (data) and CheckpointPolicy (checkpoint).
    """

    settings: tuple[tuple[str, Choice], ...]

    def get(self, name: str) -> Any:
        return dict(self.settings)[name].value

    def choice(self, name: str) -> Choice:
        return dict(self.settings)[name]
