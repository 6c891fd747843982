"""Can a 2-layer draft learn to copy (induction) from synthetic repeats in a few minutes?"""
import sys, time, torch
from specdraft.models import load_target
from specdraft.train.distill import load_draft_artifact, build_student
from specdraft.vocab import PrunedVocab
torch.set_num_threads(2); torch.manual_seed(0)
t = load_target("smollm2-135m"); m = t.model
src, minutes, lr = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
if src.startswith("["):
    student = build_student(m, eval(src)); vocab = PrunedVocab.load("specdraft/artifacts/smollm2-135m/draft/pruned_vocab.json")
else:
    student, vocab = load_draft_artifact(src, m)
head = vocab.head(student.lm_head.weight)
pool = vocab.ids[:4000]
import random
rs = random.Random(0)
def batch(B=8, L=None, g=None):
    L = L or rs.randint(16, 96)
    a = pool[torch.randint(0, len(pool), (B, L), generator=g)]
    return torch.cat([a, a], 1)
g_eval = torch.Generator().manual_seed(123); evs = {L: batch(16, L, g_eval) for L in (24, 40, 64, 90)}
def acc():
    return {L: round(acc1(ev, L), 3) for L, ev in evs.items()}
def acc1(ev, L):
    student.eval()
    with torch.inference_mode():
        h = student.model(input_ids=ev, use_cache=False).last_hidden_state
        p = vocab.ids[(h @ head.T).argmax(-1)]
    student.train()
    return (p[:, L:-1] == ev[:, L+1:]).float().mean().item()
params = [p for p in student.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=lr)
t0 = time.time(); step = 0
print("step 0 copy acc", acc(), flush=True)
student.train()
while time.time() - t0 < 60 * minutes:
    x = batch(); L = x.shape[1] // 2
    h = student.model(input_ids=x, use_cache=False).last_hidden_state[:, L:-1]  # second half
    y = vocab.to_subset(x[:, L+1:])
    loss = torch.nn.functional.cross_entropy((h @ head.T).flatten(0, 1), y.flatten())
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step(); step += 1
    if step % 100 == 0:
        print(f"step {step} {time.time()-t0:.0f}s loss {loss.item():.3f} copy acc {acc()}", flush=True)
