"""An HTML view of one generation, step by step (after DDGviz): ``paradecode trace`` writes it.

``trace_payload`` turns a ``GenerationResult`` into plain data (steps, token strings); ``render_trace`` turns
that data into one self-contained HTML file: inline CSS and JS, no network. Each decoding step is a row with
its drafted tokens (accepted green, rejected red; a tree shows its accepted path and opens to every branch)
and the target's own token (bonus after a full accept, recovered after a rejection). The output text is
coloured by the step that committed each token; hovering names the step, clicking jumps to its row.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>paradecode trace — __TITLE__</title>
<style>
:root{--ok:#1f9d55;--okbg:#dcf5e6;--no:#c53030;--nobg:#fde2e1;--bonus:#2b6cb0;--rec:#b7791f;--ink:#1a202c;
--mute:#718096;--line:#e2e8f0;font-family:system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--ink)}
body{margin:0;background:#f7fafc}
header{background:#1a202c;color:#fff;padding:14px 24px}
header h1{margin:0 0 10px;font-size:18px;font-weight:600}header h1 b{color:#90cdf4}
.cards{display:flex;flex-wrap:wrap;gap:8px}
.card{background:#2d3748;border-radius:6px;padding:6px 12px;min-width:92px}
.card .v{font-size:18px;font-weight:600}.card .k{font-size:11px;color:#a0aec0;text-transform:uppercase;letter-spacing:.04em}
main{padding:10px 24px 24px;max-width:1500px}
h2{font-size:14px;margin:16px 0 6px;text-transform:uppercase;letter-spacing:.05em;color:#4a5568}
details.prompt{background:#fff;border:1px solid var(--line);border-radius:6px;padding:6px 10px;font-size:13px}
details.prompt pre{white-space:pre-wrap;margin:6px 0 0;font-size:12px}
#output{background:#fff;border:1px solid var(--line);border-radius:6px;padding:10px 12px;white-space:pre-wrap;
font:13px/1.75 ui-monospace,SFMono-Regular,Menlo,monospace;max-height:32vh;overflow:auto}
#output span{border-radius:3px;cursor:pointer;padding:1px 0}
#output span.own{box-shadow:inset 0 -2px 0 rgba(0,0,0,.35)}#output span.hit{outline:2px solid #2b6cb0}
.legend{font-size:12px;color:var(--mute);margin:4px 0;display:flex;gap:12px;flex-wrap:wrap;align-items:center}
#timeline{display:flex;align-items:flex-end;height:46px;gap:1px;background:#fff;border:1px solid var(--line);
border-radius:6px;padding:4px 6px}
#timeline div{flex:1 1 0;min-width:1px;max-width:16px;background:#a0aec0;border-radius:1px 1px 0 0;cursor:pointer}
#timeline div.acc{background:var(--ok)}
#steps{background:#fff;border:1px solid var(--line);border-radius:6px;max-height:56vh;overflow:auto}
.step{display:grid;grid-template-columns:52px 74px 1fr 64px;gap:8px;align-items:start;padding:2px 8px;
border-bottom:1px solid #edf2f7;font-size:12px}
.step:hover{background:#f7fafc}.step.flash{background:#fefcbf}
.step .n{color:var(--mute);font-variant-numeric:tabular-nums;text-align:right;padding-top:2px}
.step .t{color:var(--mute);text-align:right;font-variant-numeric:tabular-nums;padding-top:2px}
.bar{display:flex;gap:2px;padding-top:6px}.bar i{width:7px;height:9px;border-radius:2px;background:var(--ok)}
.bar i.own{background:var(--bonus)}
.chips{display:flex;flex-wrap:wrap;gap:3px;align-items:center}
.chip{font:12px/18px ui-monospace,SFMono-Regular,Menlo,monospace;padding:0 5px;border-radius:4px;
border:1px solid transparent;white-space:pre;max-width:240px;overflow:hidden;text-overflow:ellipsis}
.chip.acc{background:var(--okbg);border-color:#9ae6b4;color:#22543d}
.chip.rej{background:var(--nobg);border-color:#feb2b2;color:#9b2c2c;text-decoration:line-through}
.chip.bonus{background:var(--bonus);color:#fff}.chip.rec{background:var(--rec);color:#fff}
.chip.own{background:#4a5568;color:#fff}
.chip.cut{opacity:.45;border-style:dashed;border-color:#718096}
.tag{font-size:10px;color:var(--mute);padding:0 4px;border:1px solid var(--line);border-radius:8px;cursor:pointer}
.branches{grid-column:3/4;display:none;border-left:2px solid var(--line);padding-left:8px;margin:2px 0 4px}
.step.open .branches{display:block}.branches .chips{margin:2px 0}
label{cursor:pointer}
</style></head><body>
<header><h1>paradecode trace · <b>__METHOD__</b> on __MODEL__</h1><div class="cards">__CARDS__</div></header>
<main>
<details class="prompt"><summary>Prompt (__PROMPT_TOKENS__ tokens)</summary><pre>__PROMPT__</pre></details>
<h2>Output</h2>
<div class="legend">Each token is coloured by the step that committed it; an underline marks the target's own token
(bonus or recovered). Hover for the step, click to jump to it.</div>
<div id="output"></div>
<h2>Steps</h2>
<div class="legend"><span class="chip acc">accepted</span><span class="chip rej">rejected</span>
<span class="chip bonus">bonus</span><span class="chip rec">recovered</span><span class="chip own">target (no draft)</span>
<span class="chip acc cut">cut (EOS / limit)</span>
<label><input type="checkbox" id="drafted-only"> only steps with a draft</label></div>
<div id="timeline" title="tokens committed per step"></div>
<div id="steps"></div>
</main>
<script type="application/json" id="trace-data">__DATA__</script>
<script>
(function(){
var D=JSON.parse(document.getElementById("trace-data").textContent);
var HUES=[205,140,35,280,350,175,60,245];
function vis(s){if(s==="")return"\\u2205";return s.replace(/ /g,"\\u00b7").replace(/\\n/g,"\\u21b5").replace(/\\t/g,"\\u2192");}
function piece(id){var p=D.pieces[String(id)];return p===undefined?"#"+id:p;}
function el(tag,cls,text){var e=document.createElement(tag);if(cls)e.className=cls;if(text!==undefined)e.textContent=text;return e;}
function chip(id,cls,title){var c=el("span","chip "+cls,vis(piece(id)));c.title=title+" · id "+id;return c;}
function jump(i){var r=document.getElementById("step-"+i);if(!r)return;r.scrollIntoView({block:"center"});
r.classList.add("flash");setTimeout(function(){r.classList.remove("flash");},900);}
function pathTo(parents,node){var p=[];while(node>=0){p.unshift(node);node=parents[node];}return p;}
var out=document.getElementById("output"),rows=document.getElementById("steps"),tl=document.getElementById("timeline");
var pos=0,maxc=1;D.steps.forEach(function(s){if(s.c>maxc)maxc=s.c;});
D.steps.forEach(function(s,i){
  var acc=s.a.length,kinds=!s.d.length?"own":s.b?"bonus":"rec",ownWord=!s.d.length?"target":s.b?"bonus":"recovered";
  var committed=[];s.a.forEach(function(k){committed.push(s.d[k]);});committed.push(s.n);
  var hue=HUES[i%HUES.length];
  for(var j=0;j<s.c;j++){var id=D.token_ids[pos+j],own=(j===acc);
    var sp=el("span",own?"own":"",D.output_pieces?D.output_pieces[pos+j]:piece(id));
    sp.style.background="hsl("+hue+",70%,"+(own?88:80)+"%)";
    sp.title="step "+(i+1)+" · "+(own?ownWord+" token":"accepted draft "+(j+1)+"/"+acc);
    sp.dataset.step=i+1;sp.onclick=function(){jump(this.dataset.step);};out.appendChild(sp);}
  pos+=s.c;
  var bar=el("div",acc>0?"acc":"");bar.style.height=Math.max(8,100*s.c/maxc)+"%";
  bar.title="step "+(i+1)+": "+s.c+" token"+(s.c===1?"":"s");bar.onclick=function(){jump(i+1);};tl.appendChild(bar);
  var row=el("div","step");row.id="step-"+(i+1);row.dataset.step=i+1;row.dataset.drafted=s.d.length;
  row.appendChild(el("div","n",String(i+1)));
  var b=el("div","bar");for(var k=0;k<s.c;k++)b.appendChild(el("i",k===acc?"own":""));b.title=s.c+" committed";row.appendChild(b);
  var chips=el("div","chips");
  if(s.p===null){s.d.forEach(function(id,k){chips.appendChild(chip(id,k<acc?"acc"+(k>=s.c?" cut":""):"rej",
      k<acc?"accepted draft "+(k+1):"rejected draft "+(k+1)));});}
  else{s.a.forEach(function(k,m){chips.appendChild(chip(s.d[k],"acc"+(m>=s.c?" cut":""),"accepted node "+k));});}
  chips.appendChild(chip(s.n,kinds+(acc>=s.c?" cut":""),ownWord+" token (target)"));
  if(s.p!==null&&s.d.length){var tag=el("span","tag","tree · "+s.d.length+" nodes ▸");tag.title="show every branch";
    tag.onclick=function(){row.classList.toggle("open");};chips.appendChild(tag);}
  if(s.i){var note=Object.keys(s.i).map(function(k){return k+"="+JSON.stringify(s.i[k]);}).join(" ");
    var info=el("span","tag",note.length>48?note.slice(0,47)+"…":note);info.title=note;chips.appendChild(info);}
  row.appendChild(chips);row.appendChild(el("div","t",(1000*s.t).toFixed(1)+" ms"));
  if(s.p!==null&&s.d.length){var br=el("div","branches"),isParent={},onPath={};
    s.p.forEach(function(q){if(q>=0)isParent[q]=true;});s.a.forEach(function(k){onPath[k]=true;});
    s.d.forEach(function(id,k){if(isParent[k])return;var line=el("div","chips");
      pathTo(s.p,k).forEach(function(nd){line.appendChild(chip(s.d[nd],onPath[nd]?"acc":"rej","node "+nd));});
      br.appendChild(line);});
    row.appendChild(br);}
  rows.appendChild(row);
});
document.getElementById("drafted-only").onchange=function(){var only=this.checked;
  Array.prototype.forEach.call(rows.children,function(r){r.style.display=only&&r.dataset.drafted==="0"?"none":"";});};
})();
</script></body></html>
"""


def trace_payload(model: Any, result: Any, *, method: str, options: dict | None = None, prompt: str = "") -> dict:
    """Plain data for ``render_trace``: the result, its steps, and the string of every token involved."""
    stats = result.stats
    tokenizer = model.tokenizer
    ids = set(result.token_ids) | {s.next_token for s in stats.steps} | {t for s in stats.steps for t in s.drafted}
    pieces = {str(i): tokenizer.decode([i], skip_special_tokens=False) for i in sorted(ids)}
    output_pieces, shown = [], 0  # each output token's share of the decoded text (multi-byte characters too)
    for i in range(len(result.token_ids)):
        text = tokenizer.decode(result.token_ids[: i + 1], skip_special_tokens=False)
        text = text if i == len(result.token_ids) - 1 else text.rstrip("\ufffd")
        output_pieces.append(text[shown:])
        shown = max(shown, len(text))
    return dict(method=method, model=model.name, options=options or {}, prompt=prompt, text=result.text,
                prompt_tokens=len(result.prompt_token_ids), token_ids=list(result.token_ids),
                stats=stats.to_dict(with_steps=True), pieces=pieces, output_pieces=output_pieces)


def _cards(payload: dict) -> str:
    s = payload["stats"]
    steps = s.get("steps") or []
    wall = s.get("wall_time_s") or 0.0
    tokens = s.get("new_tokens", len(payload["token_ids"]))
    drafted, accepted = s.get("drafted_tokens", 0), s.get("accepted_tokens", 0)
    cards = [
        ("tokens", str(tokens)),
        ("tokens / s", f"{tokens / wall:.1f}" if wall > 0 else "–"),
        ("mean accepted", f"{tokens / s['forward_passes']:.2f}" if s.get("forward_passes") else "–"),
        ("forward passes", str(s.get("forward_passes", len(steps)))),
        ("draft forwards", str(s.get("draft_forward_passes", 0))),
        ("drafted / accepted", f"{drafted} / {accepted}" + (f" ({accepted / drafted:.0%})" if drafted else "")),
        ("wall time", f"{wall:.2f} s"),
        ("stop", s.get("stop_reason") or "–"),
    ]
    options = ", ".join(f"{k}={v}" for k, v in sorted((payload.get("options") or {}).items()))
    if options:
        cards.append(("options", options))
    return "".join(f'<div class="card"><div class="v">{html.escape(v)}</div><div class="k">{html.escape(k)}</div>'
                   "</div>" for k, v in cards)


def render_trace(payload: dict) -> str:
    """The self-contained HTML page for a ``trace_payload`` (or any dict of the same shape)."""
    steps = payload["stats"].get("steps") or []
    data = dict(
        token_ids=payload["token_ids"],
        pieces=payload.get("pieces", {}),
        output_pieces=payload.get("output_pieces"),
        steps=[dict(d=s["drafted"], p=s["parents"], a=s["accepted"], n=s["next_token"], b=s["bonus"],
                    c=s["committed"], t=s.get("time_s", 0.0), i=s.get("info")) for s in steps],
    )
    # JSON inside <script>: escape <, > and & so no token string can close the element or open a comment.
    blob = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    fields = {
        "__TITLE__": html.escape(f"{payload['method']} on {payload['model']}"),
        "__METHOD__": html.escape(str(payload["method"])),
        "__MODEL__": html.escape(str(payload["model"])),
        "__CARDS__": _cards(payload),
        "__PROMPT_TOKENS__": str(payload.get("prompt_tokens", "?")),
        "__PROMPT__": html.escape(payload.get("prompt", "")),
    }
    fields["__DATA__"] = blob
    # One pass, so text inside a value (a prompt that says "__DATA__") is never substituted again.
    return re.sub(r"__[A-Z_]+__", lambda m: fields.get(m.group(0), m.group(0)), _PAGE)
