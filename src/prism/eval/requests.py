"""Text requests -> token requests, with the harness's tokenisation rules (lm_eval.api.model.TemplateLM).

- (context, continuation): whitespace at the end of the context moves to the front of the
  continuation (so " Paris" stays one BPE token); context+continuation is encoded whole and the
  context's own encoding length decides where the continuation tokens start.
- An empty context is replaced by the end-of-text token, so the first token has a condition.
- A rolling document is cut into disjoint windows of at most seq_len predicted tokens: the first
  window is conditioned on EOT, every later one on the token before it; the last window takes
  as much preceding text as fits as extra context.
"""

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
    moved: list[tuple[str, str]] = []
    for context, continuation in pairs:
        if context:
            n_space = len(context) - len(context.rstrip())
            if n_space:
                context, continuation = context[:-n_space], context[-n_space:] + continuation
        moved.append((context, continuation))
    # One batched encode per distinct string: multiple-choice contexts repeat per choice.
    wholes = [c + x if c else x for c, x in moved]
    unique = list(dict.fromkeys([c for c, _ in moved if c] + wholes))
    ids = dict(zip(unique, tok.encode_batch(unique)))
    out = []
    for (context, _), whole in zip(moved, wholes):
        whole_ids = ids[whole]
        if not context:
            if whole_ids and whole_ids[0] == prefix_token:
                ctx, cont = whole_ids[:1], whole_ids[1:]
            else:
                ctx, cont = [prefix_token], whole_ids
        else:
            ctx = ids[context]
            cont = whole_ids[len(ctx) :]
        out.append(TokenRequest(tuple(ctx), tuple(cont)))
    return out


def rolling_windows(tokens: Sequence[int], max_len: int, prefix_token: int = EOT_TOKEN) -> list[TokenRequest]:
    """Disjoint scoring windows covering every token exactly once (harness semantics with
    context_len=1: utils.get_rolling_token_windows followed by make_disjoint_window)."""
    tokens = list(tokens)
    if not tokens:
        return []
    first = min(max_len, len(tokens))
    windows = [TokenRequest((prefix_token,), tuple(tokens[:first]))]
    done = first
    while done < len(tokens):
        n_pred = min(len(tokens) - done, max_len)
        end = done + n_pred
        # The model sees max_len inputs ending just before `end`; all but the scored tail
        # of them is context (one token for a full window, more for a short last one).
        inputs = tokens[max(0, end - max_len - 1) : end - 1]
        context = inputs[: len(inputs) - (n_pred - 1)]
        windows.append(TokenRequest(tuple(context), tuple(tokens[end - n_pred : end])))
        done = end
    return windows
