"""The walk-through's figures over the whole example data, for a run or an import-hf output:

    python examples/chat/measure.py runs/assistant-sft
    python examples/chat/measure.py runs/assistant-dpo --reference runs/assistant-sft

- the loss on the assistant tokens: the mean cross-entropy over every conversation of
  conversations.jsonl, on the tokens chat data trains on (encode_chat's mask), as training takes it;
- with --reference, over every pair of pairs.jsonl: DPO's reward accuracy (the share of pairs
  whose chosen answer gains more log-probability over the reference than the rejected one), the
  mean margin at beta 0.1, and the share whose chosen answer is the more likely.

One forward per conversation through the model's own forward, in float64 numpy after the logits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TOKENIZER = HERE / "tokenizer"


def load(path: Path):
    """(forward(ids) -> float64 log-probabilities [len - 1] of each next id) of a model."""
    import jax

    from axdsl.runtime.evals import token_forward
    from axdsl.sampling import load_imported_model, load_run_model

    is_run = (path / "run.json").exists()
    loaded = load_run_model(path, "measure reads") if is_run else load_imported_model(path)
    if isinstance(loaded, str):
        sys.exit(f"error: {loaded}")
    forward = jax.jit(lambda p, x: token_forward(loaded.model.forward)(loaded.cfg, p, x))

    def logps(ids: np.ndarray) -> np.ndarray:
        logits = np.asarray(forward(loaded.params, ids[None, :-1]), np.float64)[0]
        top = logits.max(-1)
        lse = np.log(np.exp(logits - top[:, None]).sum(-1)) + top
        return logits[np.arange(len(ids) - 1), ids[1:]] - lse

    return logps


def chat_encoder():
    """encode_chat over the example tokenizer: messages -> (ids, assistant mask)."""
    from tokenizers import Tokenizer

    from axdsl.runtime.chat import encode_chat, load_special_tokens, load_template

    tokenizer = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    template, special = load_template(TOKENIZER), load_special_tokens(TOKENIZER)
    return lambda messages: encode_chat(messages, tokenizer, template, special)


def assistant_loss(logps, encode) -> tuple[float, int]:
    """(mean cross-entropy, count) over the assistant tokens of conversations.jsonl."""
    nll, count = 0.0, 0
    for line in (HERE / "conversations.jsonl").read_text(encoding="utf-8").splitlines():
        ids, mask = encode(json.loads(line)["messages"])
        nll -= float((logps(ids) * mask[1:]).sum())
        count += int(mask[1:].sum())
    return nll / count, count


def answer_logps(logps, encode) -> np.ndarray:
    """[pairs, 2]: the summed log-probability of each pair's chosen and rejected answer."""
    from axdsl.runtime.chat import answer_mask, preference_conversations

    out = []
    for line in (HERE / "pairs.jsonl").read_text(encoding="utf-8").splitlines():
        chosen, rejected, turns = preference_conversations(json.loads(line))
        pair = []
        for messages in (chosen, rejected):
            ids, mask = encode(messages)
            pair.append(float((logps(ids) * answer_mask(mask, turns)[1:]).sum()))
        out.append(pair)
    return np.asarray(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a run directory or an import-hf output")
    parser.add_argument("--reference", type=Path, help="the DPO reference (a run or an import)")
    args = parser.parse_args(argv)
    encode, logps = chat_encoder(), load(args.model)
    loss, count = assistant_loss(logps, encode)
    print(f"{args.model}: loss on the {count} assistant tokens of conversations.jsonl {loss:.4f}")
    if args.reference is not None:
        policy, reference = answer_logps(logps, encode), answer_logps(load(args.reference), encode)
        gain = (policy[:, 0] - reference[:, 0]) - (policy[:, 1] - reference[:, 1])
        print(
            f"{args.model} over the {len(gain)} pairs of pairs.jsonl: reward accuracy "
            f"{np.mean(gain > 0):.3f}, mean margin {0.1 * gain.mean():.3f} (beta 0.1), chosen "
            f"more likely {np.mean(policy[:, 0] > policy[:, 1]):.3f} (reference: "
            f"{np.mean(reference[:, 0] > reference[:, 1]):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
