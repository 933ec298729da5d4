"""A random valid expert placement for `ina place --file`, from the one `ina place --show`
printed: each logical expert on a random EP rank, then redundant replicas of random
experts on other ranks, with one slot more per rank than the least that fits, slots in
random order. usage: random_placement.py SHOWN.json OUT.json SEED"""
import json
import random
import sys

shown, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
d = json.load(open(shown))
ep = d["layout"]["ep"]
experts = 1 + max(s["logical_expert"] for l in d["layers"] for s in l["slots"])
slots = min(experts, -(-experts // ep) + 1)
for layer in d["layers"]:
    held = [[] for _ in range(ep)]
    order = list(range(experts))
    rng.shuffle(order)
    for x in order:
        rank = rng.choice([r for r in range(ep) if len(held[r]) < slots])
        held[rank].append(x)
    for r in range(ep):  # replicas of experts this rank lacks fill the rest
        lacking = [x for x in range(experts) if x not in held[r]]
        rng.shuffle(lacking)
        held[r] += lacking[: slots - len(held[r])]
        rng.shuffle(held[r])
    layer["slots"] = [{"ep_rank": r, "slot": i, "logical_expert": x}
                      for r in range(ep) for i, x in enumerate(held[r])]
d["slots_per_rank"] = slots
json.dump(d, open(out, "w"), indent=1)
