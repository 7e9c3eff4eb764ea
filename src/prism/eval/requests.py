"""Text requests -> token requests, with the harness's tokenisation rules (lm_eval.api.model.TemplateLM;
docs/evaluation.md, "Zero-shot evaluation")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer


@dataclass(frozen=True)
class TokenRequest:
    """Score `continuation` after `context`; both non-empty token lists."""

    context: tuple[int, ...]
    continuation: tuple[int, ...]


def encode_pairs(
    tok: GPT2Tokenizer, pairs: Sequence[tuple[str, str]], prefix_token: int = EOT_TOKEN
) -> list[TokenRequest]:
    """Tokenise (context, continuation) string pairs the way TemplateLM.loglikelihood does."""
    # trailing whitespace of the context moves to the continuation
    moved = [(c.rstrip(), c[len(c.rstrip()) :] + x) for c, x in pairs]
    # One batched encode per distinct string: multiple-choice contexts repeat per choice.
    wholes = [c + x for c, x in moved]
    unique = list(dict.fromkeys([c for c, _ in moved if c] + wholes))
    ids = dict(zip(unique, tok.encode_batch(unique)))
    out = []
    for (context, _), whole in zip(moved, wholes):
        whole_ids = ids[whole]
        if context:
            ctx, cont = ids[context], whole_ids[len(ids[context]) :]
        elif whole_ids[:1] == [prefix_token]:
            ctx, cont = whole_ids[:1], whole_ids[1:]
        else:
            ctx, cont = [prefix_token], whole_ids
        out.append(TokenRequest(tuple(ctx), tuple(cont)))
    return out


def rolling_windows(tokens: Sequence[int], max_len: int, prefix_token: int = EOT_TOKEN) -> list[TokenRequest]:
    """Disjoint scoring windows covering every token exactly once (harness semantics with
    context_len=1: utils.get_rolling_token_windows followed by make_disjoint_window)."""
    tokens = list(tokens)
    if not tokens:
        return []
    windows = [TokenRequest((prefix_token,), tuple(tokens[:max_len]))]
    for done in range(max_len, len(tokens), max_len):
        end = min(done + max_len, len(tokens))
        # The model sees max_len inputs ending just before `end`; all but the scored tail
        # of them is context (one token for a full window, more for a short last one).
        inputs = tokens[max(0, end - max_len - 1) : end - 1]
        context = inputs[: len(inputs) - (end - done - 1)]
        windows.append(TokenRequest(tuple(context), tuple(tokens[done:end])))
    return windows
