"""The train block's `lora(...)` directive: low-rank adapters on chosen weight matrices.

    train {
      init_from = "../runs/tiny_llama-hf/params"
      lora(rank = 8, alpha = 16, targets = "blocks/*/attn/w[qv]")
    }

Each target W (a parameter with at least two axes per layer) is read as a matrix [in, out] and
trained as W + (alpha / rank) * A @ B with A [..., in, rank] (small random) and B [..., rank, out]
(zeros, so step 0 is the base model); `...` are the stacked layers of a repeat. The base weights
are frozen and hold no optimizer state: only the adapters train, which is where the memory goes
down (`axdsl aot`, `axdsl stats`).

`targets` are comma-separated globs over parameter paths. A path is matched as train.py names it
(`blocks/attn/wq`) and with a layer index after each repeat (`blocks/0/attn/wq`), so the usual
`blocks/*/attn/w[qv]` reads as "every layer's". Every glob must match a matrix parameter.
A matrix's `in` is its first per-layer axis, unless that is not `embed` and its last one is
(an output projection such as wo [heads, head_dim, embed]: in = heads x head_dim).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

from axdsl.errors import Diagnostics, did_you_mean
from axdsl.ir import nodes as ir

DEFAULTS = {"rank": 8, "alpha": 16.0, "targets": "blocks/*/attn/w[qv]"}


@dataclass(frozen=True)
class LoraSettings:
    """The resolved `lora(...)`: adapter rank, scale numerator and target globs."""

    rank: int = 8
    alpha: float = 16.0
    targets: str = "blocks/*/attn/w[qv]"

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclass(frozen=True)
class Target:
    """One adapted parameter: its path, its stacked layer dims and its [in, out] matrix split."""

    path: str
    param: ir.Param
    split: int  # per-layer axes that are `in`; the rest are `out`

    @property
    def stack(self) -> tuple[int, ...]:
        return tuple(ir.static_size(d) for d in self.param.stack)

    @property
    def rows(self) -> int:
        return math.prod(ir.static_size(d) for d in self.param.dims[: self.split])

    @property
    def cols(self) -> int:
        return math.prod(ir.static_size(d) for d in self.param.dims[self.split :])

    def adapter_elements(self, rank: int) -> int:
        """Elements of A and B together."""
        return math.prod(self.stack) * rank * (self.rows + self.cols)


def parse(d: ir.Directive, diags: Diagnostics) -> LoraSettings | None:
    """`lora(rank = 8, alpha = 16, targets = "...")`: keyword arguments, each checked and
    located."""
    if d.args:
        diags.error(
            d.args[0].span,
            "lora(...) takes `name = value` arguments",
            'for example lora(rank = 8, alpha = 16, targets = "blocks/*/attn/w[qv]")',
        )
        return None
    out: dict = dict(DEFAULTS)
    ok = True
    for k, v, span in ((a.key, a.value, a.span) for a in d.kwargs):
        if k not in out:
            diags.error(
                span,
                f"lora has no option `{k}`",
                did_you_mean(k, DEFAULTS) or f"options: {', '.join(DEFAULTS)}",
            )
        elif k == "rank" and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            diags.error(
                span, f"lora(rank = ...) must be an integer >= 1, got {v!r}", "for example rank = 8"
            )
        elif k == "alpha" and not (
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        ):
            diags.error(
                span, f"lora(alpha = ...) must be a number > 0, got {v!r}", "for example alpha = 16"
            )
        elif k == "targets" and not (isinstance(v, str) and patterns(v)):
            diags.error(
                span,
                "lora(targets = ...) is a string of comma-separated globs over parameter paths",
                'for example targets = "blocks/*/attn/w[qv]"',
            )
        else:
            out[k] = float(v) if k == "alpha" else v
            continue
        ok = False
    return LoraSettings(out["rank"], out["alpha"], out["targets"].strip()) if ok else None


def patterns(targets: str) -> list[str]:
    """The globs of a `targets` setting, in order."""
    return [g.strip() for g in targets.split(",") if g.strip()]


def _params(root: ir.Instance) -> list[tuple[str, str, ir.Param]]:
    """(path, path with a layer index after each repeat, param) for every parameter."""
    repeats = {i.path for i in root.walk() if i.repeat is not None}
    out = []
    for inst in root.walk():
        parts, indexed, prefix = [p for p in inst.path.split("/") if p], [], ""
        for part in parts:
            prefix += "/" + part
            indexed += [part, "0"] if prefix in repeats else [part]
        for p in inst.params:
            out.append(("/".join(parts + [p.name]), "/".join(indexed + [p.name]), p))
    return out


def _split(p: ir.Param) -> int:
    if len(p.dims) > 2 and p.axes[0] != "embed" and p.axes[-1] == "embed":
        return len(p.dims) - 1
    return 1


def resolve(settings: LoraSettings, root: ir.Instance) -> tuple[list[Target], list[str]]:
    """The adapted parameters, in parameter order, and a problem per glob that fits nothing."""
    params = _params(root)
    chosen: dict[str, Target] = {}
    problems = []
    for glob in patterns(settings.targets):
        hits = [
            (path, p)
            for path, indexed, p in params
            if fnmatch.fnmatchcase(path, glob) or fnmatch.fnmatchcase(indexed, glob)
        ]
        if not hits:
            names = [path for path, _, _ in params]
            near = did_you_mean(glob, names)
            problems.append(
                f"lora target `{glob}` matches no parameter"
                + (f" ({near})" if near else f"; parameters: {', '.join(names[:8])}, ...")
            )
        for path, p in hits:
            if len(p.dims) < 2:
                problems.append(
                    f"lora target `{glob}` matches `{path}` of shape "
                    f"{[ir.static_size(d) for d in p.dims]} per layer: "
                    "adapters need a matrix (two or more axes)"
                )
            else:
                chosen[path] = Target(path, p, _split(p))
    order = [path for path, _, _ in params]
    return sorted(chosen.values(), key=lambda t: order.index(t.path)), problems


def cross_check(values: dict, module: ir.Module, diags: Diagnostics) -> None:
    """Every target glob matches a matrix of the first model; lora is not combined with freeze
    (it freezes every base weight already); only next-token training has adapters so far."""
    if "lora" not in values:
        return
    choice = values["lora"]
    span = choice.origin.span
    _, problems = resolve(choice.value, module.models[0].root)
    for problem in problems:
        diags.error(
            span,
            problem.replace(
                "matches no parameter", f"matches no parameter of {module.models[0].name}"
            ),
        )
    if "freeze" in values:
        diags.error(
            values["freeze"].origin.span,
            "`freeze` and lora(...) together: lora already freezes " "every base weight",
            "drop `freeze`; only the adapters train",
        )
    kinds = ir.ObjectiveKind
    # next-token models' objectives: next_token and the preference ones
    adapted = (kinds.NEXT_TOKEN, kinds.DPO, kinds.SIMPO, kinds.ORPO)
    if "objective" in values and values["objective"].value.name not in adapted:
        diags.error(
            span,
            "lora(...) supports the next_token, dpo, simpo and orpo objectives, not "
            f"{values['objective'].value.name}",
            "fine-tune this model fully, or with `freeze`",
        )


def adapter_table(module: ir.Module) -> list[tuple[str, int, int]]:
    """(path, stacked layer axes, `in` axes) of each target: train.py's LORA_TARGETS."""
    settings = module.train.get("lora")
    targets, _ = resolve(settings, module.models[0].root)
    return [(t.path, len(t.param.stack), t.split) for t in targets]
