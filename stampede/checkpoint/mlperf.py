"""MLPerf Storage's checkpointing workload: the files each rank writes, and their sizes.
Pure functions, no I/O, no MPI.

The models and their parallelism are those of mlcommons/storage's DLIO workload configs
(configs/dlio/workload/llama3_*.yaml) and the closed rank counts of mlpstorage
(LLM_ALLOWED_VALUES); the files per rank follow DLIO's current checkpointing (its
BaseCheckpointing: tensors per layer, the pipeline stages' layers, ZeRO's sharding),
recomputed here from the model's shape, never copied:

- rank r: tensor-parallel rank r mod TP, pipeline stage (r div TP) mod PP, model-parallel
  rank m = r mod (TP x PP), data-parallel rank d = r div (TP x PP).
- model states (fp16): stage p holds layers [first, last] of the L transformer layers
  (stage 0 also layer 0, the embedding; the last stage also L+1 and L+2, lm_head and the
  final norm). ZeRO 3: every rank its 1/DP of its stage's layers, in one file
  `zero_pp_rank_{d}_mp_rank_{m}_model_states.pt`; ZeRO 1 and 2: data-parallel rank 0
  only, one file per layer `layer_{l}-model_{m}_model_states.pt` (PP > 1) or one file
  `model_{m}_model_states.pt`.
- optimizer states (fp32): every rank `zero_pp_rank_{d}_mp_rank_{m}_optim_states.pt`
  of 3 x (P / (DP x TP x PP)) + 15 h elements (three groups of the parameters' share and
  5 h each).

DLIO writes each file with torch.save (a pickle around the tensors: a few KiB more per
file); stampede writes the tensors' bytes alone. Subset mode: the run's N ranks (one host
of 8) are the first N ranks of the closed run, with its data parallelism, so each writes
the files and bytes it would write there. A scale below 1 shrinks every file (to whole
4 KiB pages) and keeps the layout; a scaled or subset run is not comparable with
submissions, and every output says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from stampede.errors import UsageError
from stampede.results.mlperf import NOT_COMPARABLE
from stampede.spec import WORKLOAD_RANKS
from stampede.units import ALIGN_BYTES

MODEL_BYTES_PER_ELEMENT = 2      # model_datatype fp16
OPTIMIZER_BYTES_PER_ELEMENT = 4  # optimizer_datatype fp32
SUBSET_RANKS = 8                 # mlpstorage's LLM_SUBSET_PROCS: one host of 8 processes


@dataclass(frozen=True)
class Model:
    name: str                    # the workload (checkpoint.workload)
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int
    tp: int
    pp: int
    zero: int

    @property
    def closed_ranks(self) -> int:
        """The rank count of a closed submission."""
        return WORKLOAD_RANKS[self.name]

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp

    @property
    def closed_dp(self) -> int:
        return self.closed_ranks // self.model_parallel

    def parameters(self) -> int:
        """Every parameter of the model (embedding, layers, final norm, lm_head)."""
        kv = self.hidden // self.heads * self.kv_heads
        h = self.hidden
        layer = h + h * (h + 2 * kv) + h * h + h + 3 * h * self.ffn_hidden
        return 2 * self.vocab * h + layer * self.layers + h


MODELS = {model.name: model for model in (
    Model("llama3-8b", 32, 4096, 14336, 32, 8, 128256, tp=1, pp=1, zero=3),
    Model("llama3-70b", 80, 8192, 28672, 128, 8, 128256, tp=8, pp=1, zero=3),
    Model("llama3-405b", 126, 16384, 53248, 128, 8, 128256, tp=8, pp=32, zero=1),
    Model("llama3-1t", 128, 25872, 98304, 192, 32, 128256, tp=8, pp=64, zero=1),
)}


def layer_elements(model: Model, layer: int, dp: int) -> int:
    """fp16 elements of one layer on one rank: its tensors, each split over TP (and over
    DP with ZeRO 3), rounded down tensor by tensor."""
    shard = dp if model.zero == 3 else 1
    h, tp = model.hidden, model.tp
    if layer in (0, model.layers + 1):           # embedding, lm_head
        return h * model.vocab // tp // shard
    if layer == model.layers + 2:                # the final norm
        return h // shard
    kv = h // model.heads * model.kv_heads
    tensors = (h // shard, h * (h + 2 * kv) // tp // shard, h * h // tp // shard, h // shard,
               h * 2 * model.ffn_hidden // tp // shard, h * model.ffn_hidden // tp // shard)
    return sum(tensors)


def stage_layers(model: Model, stage: int) -> range:
    """The layers pipeline stage `stage` holds: the transformer layers spread evenly (the
    first stages take one more when they do not divide), stage 0 also layer 0, the last
    also L+1 and L+2."""
    per, extra = divmod(model.layers, model.pp)
    first = stage * per + min(stage, extra) + 1
    last = first + per - (0 if stage < extra else 1)
    if stage == model.pp - 1:
        last = model.layers + 2
    if stage == 0:
        first = 0
    return range(first, last + 1)


def data_parallel(model: Model, nranks: int, subset: bool) -> int:
    """DP: the closed run's in subset mode, else what the rank count allows (UsageError for
    a rank count the model's TP x PP does not divide: no rank would hold a whole share)."""
    if subset:
        return model.closed_dp
    if nranks % model.model_parallel:
        raise UsageError(f"checkpoint.workload = {model.name!r} on {nranks} rank(s): its TP x PP "
                         f"= {model.tp} x {model.pp} = {model.model_parallel} must divide the "
                         f"rank count", hint="run on a multiple of it, or set checkpoint.subset "
                         f"= true (the first ranks of the closed run's {model.closed_ranks})")
    return nranks // model.model_parallel


def rank_files(model: Model, rank: int, nranks: int, subset: bool = False,
               scale: Fraction = Fraction(1)) -> tuple[tuple[str, int], ...]:
    """(file name, bytes) of every file rank `rank` writes in one checkpoint."""
    dp = data_parallel(model, nranks, subset)
    mp_rank, dp_rank = rank % model.model_parallel, rank // model.model_parallel
    stage = (rank // model.tp) % model.pp
    layers = stage_layers(model, stage)
    files: list[tuple[str, int]] = []
    if model.zero == 3:
        elements = sum(layer_elements(model, layer, dp) for layer in layers)
        files.append((f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank}_model_states.pt", elements))
    elif dp_rank == 0 and model.pp > 1:
        files.extend((f"layer_{layer}-model_{mp_rank}_model_states.pt",
                      layer_elements(model, layer, dp)) for layer in layers)
    elif dp_rank == 0:
        files.append((f"model_{mp_rank}_model_states.pt",
                      sum(layer_elements(model, layer, dp) for layer in layers)))
    sized = [(name, elements * MODEL_BYTES_PER_ELEMENT) for name, elements in files]
    share = model.parameters() // (dp * model.model_parallel)
    optimizer = (3 * share + 15 * model.hidden) * OPTIMIZER_BYTES_PER_ELEMENT
    sized.append((f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank}_optim_states.pt", optimizer))
    return tuple((name, scaled_bytes(nbytes, scale)) for name, nbytes in sized)


def scaled_bytes(nbytes: int, scale: Fraction) -> int:
    """A file's bytes at a scale: whole 4 KiB pages, at least one (O_DIRECT, alignment)."""
    if scale == 1:
        return nbytes
    return max(ALIGN_BYTES, int(nbytes * scale) // ALIGN_BYTES * ALIGN_BYTES)


def checkpoint_bytes(model: Model, nranks: int, subset: bool = False,
                     scale: Fraction = Fraction(1)) -> int:
    """One checkpoint's bytes, all ranks of this run."""
    return sum(nbytes for rank in range(nranks)
               for _, nbytes in rank_files(model, rank, nranks, subset, scale))


def at_scale(model: Model, nranks: int) -> tuple[int, int, int]:
    """(the largest rank's bytes, the checkpoint's bytes, the largest rank's files) of one
    checkpoint at `nranks` (a multiple of TP x PP); every data-parallel rank past the first
    writes what the second does, so two of them are enough at any scale."""
    if nranks % model.model_parallel:
        raise ValueError(f"{nranks} ranks: {model.name} needs a multiple of TP x PP = "
                         f"{model.tp} x {model.pp} = {model.model_parallel}")
    dp = nranks // model.model_parallel
    first = [rank_files(model, rank, nranks) for rank in range(model.model_parallel)]
    rest = [rank_files(model, rank, nranks)
            for rank in range(model.model_parallel, 2 * model.model_parallel)] if dp > 1 else []
    sizes = [sum(nbytes for _, nbytes in files) for files in first + rest]
    total = sum(sizes[:len(first)]) + (dp - 1) * sum(sizes[len(first):])
    return max(sizes), total, max(len(files) for files in first + rest)


def display_name(model: Model) -> str:
    """llama3-70b -> Llama 3 70B."""
    return "Llama 3 " + model.name.removeprefix("llama3-").upper()


def job_text(model: Model) -> str:
    """The job file of one model (jobs/mlperf-checkpoint-SIZE.toml), sizes in its comments."""
    from stampede.units import format_bytes

    n = model.closed_ranks
    total = checkpoint_bytes(model, n)
    states = sum(nbytes for rank in range(n) for name, nbytes in rank_files(model, rank, n)
                 if name.endswith("_model_states.pt"))
    files = sum(len(rank_files(model, rank, n)) for rank in range(n))
    mine = rank_files(model, 0, n)
    first = f"{len(mine)} files, {format_bytes(sum(nbytes for _, nbytes in mine))}"
    size = model.name.removeprefix("llama3-")
    return f"""\
# MLPerf Storage checkpointing, {model.name}: generated by
# `python -m stampede.checkpoint.mlperf jobs` (edit the generator, not this file).
# TP x PP x DP = {model.tp} x {model.pp} x {model.closed_dp}, ZeRO {model.zero}, {n} ranks (closed).
# One checkpoint: {format_bytes(total)} in {files} files (model states {format_bytes(states)},
# optimizer states {format_bytes(total - states)}); rank 0 writes {first}.
#
#   mpiexec -n {n} stampede cycle jobs/mlperf-checkpoint-{size}.toml --set target.path=/lustre/$USER/mlperf
#   mpiexec -n {SUBSET_RANKS} stampede cycle jobs/mlperf-checkpoint-{size}.toml --set checkpoint.subset=true
#
# (on a laptop: --scale 1/1024). A subset or scaled run, or one at another rank count, is {NOT_COMPARABLE}.

[target]
path = "stampede-mlperf"

[checkpoint]
layout = ["mlperf"]
workload = "{model.name}"

[run]
iterations = 10                 # DLIO: num_checkpoints_write = num_checkpoints_read = 10
warmup = 0
deadline_s = 3600

[save]
validate = "none"               # DLIO does not re-read what it wrote
keep = 10                       # DLIO deletes nothing between its writes

[archive]
path = "results/{{job}}.csv"
"""


def write_jobs(directory: str) -> list[str]:
    """Every model's job file under `directory` (made if missing); returns their paths."""
    from pathlib import Path

    Path(directory).mkdir(parents=True, exist_ok=True)
    paths = []
    for model in MODELS.values():
        path = Path(directory) / f"mlperf-checkpoint-{model.name.removeprefix('llama3-')}.toml"
        path.write_text(job_text(model))
        paths.append(str(path))
    return paths


if __name__ == "__main__":
    import sys

    print("\n".join(write_jobs(sys.argv[1] if len(sys.argv) > 1 else "jobs")))
