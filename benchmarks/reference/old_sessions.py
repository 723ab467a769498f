"""The Day-6 generator's session layout as it was before issue 36 (commit 09e648d): the open
sessions in a plain list (``del opened[k]`` / ``del opened[0]`` shift the list: O(n) each) and
block hashes as Python int lists. `benchmarks/bench_speed_targets.py` times it against
`eplb.evaluation.serving.workload.synth._sessions` on the same draws (same outputs)."""

from __future__ import annotations

from eplb.evaluation.serving.workload.synth import _Draws


def _sessions(
    d: _Draws,
    p: float,
    *,
    system_tokens: int,
    open_sessions: int,
    max_input: int,
    block: int,
    hashes: bool,
):
    """Lay the requests out in sessions with continuation probability ``p``.

    Returns ``(input_tokens, session, hit_tokens, block_hashes | None)``: a continuation's
    prompt is its session's previous prompt and output plus the new tokens; a new session's is
    its system prompt plus the new tokens. ``hit_tokens`` is what an unbounded prefix cache
    serves (the previous prompt's full blocks, or a system prompt's full blocks after its first
    use).
    """
    n = d.n
    sys_blocks = system_tokens // block
    num_sys = max(d.system) + 1 if n else 0
    next_id = 0
    sys_hash: list[list[int]] = []
    if hashes:
        for _ in range(num_sys):
            sys_hash.append(list(range(next_id, next_id + sys_blocks)))
            next_id += sys_blocks
    sys_seen = [False] * num_sys
    opened: list[int] = []
    ctx_tokens: dict[int, int] = {}
    ctx_blocks: dict[int, list[int] | int] = {}
    inp = [0] * n
    ses = [0] * n
    out_h: list | None = [None] * n if hashes else None
    hit_total = 0
    sessions = 0
    for i in range(n):
        new = d.new[i]
        cont = d.turn[i] < p and opened
        if cont:
            k = int(d.pick[i] * len(opened))
            s = opened[k]
            length = ctx_tokens[s] + new
            if length > max_input:  # the conversation outgrew the context: it ends here
                del opened[k]
                cont = False
            else:
                if k != len(opened) - 1:
                    del opened[k]
                    opened.append(s)
                prev = ctx_blocks[s]
                reuse = len(prev) if hashes else prev
                hit_total += reuse * block
        if not cont:
            s = sessions
            sessions += 1
            j = d.system[i]
            length = min(new + (system_tokens if j >= 0 else 0), max_input)
            reuse = min(sys_blocks, length // block) if j >= 0 else 0
            if j >= 0:
                if sys_seen[j]:
                    hit_total += reuse * block
                sys_seen[j] = True
            opened.append(s)
            if len(opened) > open_sessions:
                del opened[0]
            prev = sys_hash[j] if hashes and j >= 0 else []
        nblocks = -(-length // block)
        if hashes:
            h = prev[:reuse] + list(range(next_id, next_id + nblocks - reuse))
            next_id += nblocks - reuse
            out_h[i] = h
            ctx_blocks[s] = h[: length // block]
        else:
            ctx_blocks[s] = length // block
        ctx_tokens[s] = length + d.out[i]
        inp[i] = length
        ses[i] = s
    return inp, ses, hit_total, out_h
