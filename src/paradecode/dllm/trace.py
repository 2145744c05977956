"""An HTML view of one masked-diffusion decoding: which canvas positions each step committed.

A grid with one row per forward pass and one column per canvas position: the cell of a position committed at
that step shows its token (shaded by confidence), positions committed earlier stay grey, masks are blank and
positions the end-of-text stop filled are marked. Self-contained (inline CSS), no script, no network.
"""

from __future__ import annotations

import html

_STYLE = """body{font-family:system-ui,sans-serif;margin:20px;color:#1a202c}
table{border-collapse:collapse;font:13px ui-monospace,monospace}td,th{border:1px solid #e2e8f0;
padding:2px 6px;text-align:center;min-width:22px}th{background:#f7fafc;font-weight:500;color:#4a5568}
td.new{font-weight:700}td.old{color:#a0aec0}td.fill{color:#a0aec0;background:#fefcbf}.k{color:#718096}"""


def _cell(kind: str, text: str, confidence: float | None = None) -> str:
    style = f' style="background:hsl(140,60%,{95 - 35 * confidence:.0f}%)"' if confidence is not None else ""
    title = f' title="confidence {confidence:.3f}"' if confidence is not None else ""
    return f'<td class="{kind}"{style}{title}>{html.escape(text)}</td>'


def render_dllm_trace(model, prompt: str, result, model_name: str) -> str:
    """HTML for a ``DiffusionResult`` (its stats carry one ``CommitStep`` per forward pass)."""
    steps, canvas = result.stats.steps, result.canvas
    word = lambda i: model.decode([i]) or "⏎"  # end-of-text decodes to '' (the answer stops there)
    state: list[str | None] = [None] * len(canvas)
    rows = []
    for n, step in enumerate(steps, 1):
        cells = []
        fresh = {p: (t, c) for p, t, c in zip(step.positions, step.tokens, step.confidences)}
        for pos in range(len(canvas)):
            if pos in fresh:
                state[pos] = word(fresh[pos][0])
                cells.append(_cell("new", state[pos], fresh[pos][1]))
            elif pos in step.filled:
                state[pos] = "⏎"
                cells.append(_cell("fill", "⏎"))
            else:
                cells.append(_cell("old", state[pos]) if state[pos] is not None else "<td></td>")
        rows.append(f"<tr><th>{n}</th><th>{len(step.positions)}</th>{''.join(cells)}</tr>")
    s = result.stats
    header = "".join(f"<th>{p}</th>" for p in range(len(canvas)))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>dLLM trace</title><style>{_STYLE}</style>"
            f"</head><body><h2>{html.escape(s.info.get('sampler', ''))} on {html.escape(model_name)}</h2>"
            f"<p><span class='k'>prompt</span> {html.escape(prompt)}<br><span class='k'>answer</span> "
            f"{html.escape(result.text)}<br><span class='k'>{s.new_tokens} answer tokens, {s.forward_passes} forward "
            f"passes, {s.mean_accepted:.2f} tokens/forward, {s.wall_time_s * 1000:.1f} ms, stop: {s.stop_reason}"
            f"</span></p><table><tr><th>step</th><th>new</th>{header}</tr>{''.join(rows)}</table>"
            "<p class='k'>Bold: committed at this step (greener = more confident); grey: committed earlier; "
            "yellow: filled by the end-of-text stop.</p></body></html>")
