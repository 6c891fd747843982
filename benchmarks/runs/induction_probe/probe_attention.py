"""Induction by attention supervision: on repeats with varying spans, a layer-0 head is told to
attend to the previous token and a layer-1 head to the token after the earlier occurrence."""
import sys, time, random, torch
from specdraft.models import load_target
from specdraft.train.distill import load_draft_artifact
torch.set_num_threads(2); torch.manual_seed(0)
t = load_target("smollm2-135m"); m = t.model
src, minutes, lr, w = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
m.set_attn_implementation("eager")
student, vocab = load_draft_artifact(src, m)
student.set_attn_implementation("eager")
head = vocab.head(student.lm_head.weight)
pool = vocab.ids[:4000]
rs = random.Random(0)
def batch(B=8, L=None, g=None):
    L = L or rs.randint(16, 96)
    a = pool[torch.randint(0, len(pool), (B, L), generator=g)]
    return torch.cat([a, a], 1)
g_eval = torch.Generator().manual_seed(123); evs = {L: batch(16, L, g_eval) for L in (24, 40, 64, 90)}
def acc():
    student.eval(); out = {}
    with torch.inference_mode():
        for L, ev in evs.items():
            h = student.model(input_ids=ev, use_cache=False).last_hidden_state
            p = vocab.ids[(h @ head.T).argmax(-1)]
            out[L] = round((p[:, L:-1] == ev[:, L+1:]).float().mean().item(), 3)
    student.train(); return out
# choose heads: layer 0's most previous-token-like head, layer 1's least
with torch.inference_mode():
    o = student.model(input_ids=evs[40], output_attentions=True, use_cache=False)
T = evs[40].shape[1]; r = torch.arange(1, T)
prev = [a[:, :, r, r - 1].mean(dim=(0, 2)) for a in o.attentions]
H0, H1 = int(prev[0].argmax()), int(prev[1].argmin())
print("heads", H0, H1, [p.tolist() for p in prev], flush=True)
params = [p for p in student.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=lr)
t0 = time.time(); step = 0
print("step 0 copy acc", acc(), flush=True)
student.train()
while time.time() - t0 < 60 * minutes:
    x = batch(); L = x.shape[1] // 2; T = x.shape[1]
    o = student.model(input_ids=x, output_attentions=True, use_cache=False)
    h = o.last_hidden_state[:, L:-1]
    y = vocab.to_subset(x[:, L+1:])
    ce = torch.nn.functional.cross_entropy((h @ head.T).flatten(0, 1), y.flatten())
    r = torch.arange(1, T); q = torch.arange(L, T)
    a0 = o.attentions[0][:, H0, r, r - 1]
    a1 = o.attentions[1][:, H1, q, q - L + 1]
    att = -(a0.clamp_min(1e-6).log().mean() + a1.clamp_min(1e-6).log().mean())
    loss = ce + w * att
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step(); step += 1
    if step % 50 == 0:
        print(f"step {step} {time.time()-t0:.0f}s ce {ce.item():.3f} att {att.item():.3f} a0 {a0.mean().item():.2f} a1 {a1.mean().item():.2f} copy acc {acc()}", flush=True)
