"""Random-interleaving model of the Hopper forward's slots on this branch (K released after the softmax, V after P V, V loaded a block behind K): deadlocks and slots written while read. python3 bench/hopper_fwd_protocol.py; 0 trials with errors expected."""
import random

class MBar:
    def __init__(s, count): s.count, s.pending, s.completed = count, 0, 0
    def arrive(s):
        s.pending += 1
        if s.pending == s.count: s.pending, s.completed = 0, s.completed + 1
    def ready(s, parity): return (s.completed & 1) != parity

class Named:
    def __init__(s): s.arrived, s.phase = 0, 0
    def arrive(s):
        s.arrived += 128
        if s.arrived == 256: s.arrived, s.phase = 0, s.phase + 1

def run(tiles, STAGES, QS, seed, pingpong=True):
    rnd = random.Random(seed)
    fullK = [MBar(1) for _ in range(STAGES)]; fullV = [MBar(1) for _ in range(STAGES)]
    emptyK = [MBar(2) for _ in range(STAGES)]; emptyV = [MBar(2) for _ in range(STAGES)]
    barQ = [MBar(1) for _ in range(QS)]; emptyQ = [MBar(2) for _ in range(QS)]
    named = {2: Named(), 3: Named()}
    kslot = [None] * STAGES; vslot = [None] * STAGES; qslot = [None] * QS
    kread = [set() for _ in range(STAGES)]; vread = [set() for _ in range(STAGES)]
    errors = []

    def bar_sync(i):
        named[i].arrive()
        if named[i].arrived == 0: return
        target = named[i].phase + 1
        while named[i].phase < target: yield

    def producer():
        n = kv = 0
        for t, nb in enumerate(tiles):
            qs, qr = n % QS, n // QS
            if qr > 0:
                while not emptyQ[qs].ready((qr - 1) & 1): yield
            n += 1; qslot[qs] = t; barQ[qs].arrive(); yield
            def load_v(g):
                st, r = g % STAGES, g // STAGES
                if r > 0:
                    while not emptyV[st].ready((r - 1) & 1): yield
                if vread[st]: errors.append("V slot %d overwritten while read %s" % (st, vread[st]))
                vslot[st] = g; fullV[st].arrive(); yield
            for it in range(nb):
                st, r = kv % STAGES, kv // STAGES
                if r > 0:
                    while not emptyK[st].ready((r - 1) & 1): yield
                if kread[st]: errors.append("K slot %d overwritten while read %s" % (st, kread[st]))
                kslot[st] = kv; fullK[st].arrive(); yield
                if it > 0: yield from load_v(kv - 1)
                kv += 1
            yield from load_v(kv - 1)

    def consumer(c):
        n = kv = 0
        st = lambda g: g % STAGES
        par = lambda g: (g // STAGES) & 1
        for t, nb in enumerate(tiles):
            qs = n % QS
            while not barQ[qs].ready((n // QS) & 1): yield
            if qslot[qs] != t: errors.append("Q slot holds %s for tile %d" % (qslot[qs], t))
            while not fullK[st(kv)].ready(par(kv)): yield
            if kslot[st(kv)] != kv: errors.append("S(%d) read K %s" % (kv, kslot[st(kv)]))
            yield
            emptyK[st(kv)].arrive(); yield
            if pingpong and c == 0 and n == 0: named[2].arrive()
            for it in range(1, nb):
                cur, prev = kv + it, kv + it - 1
                if pingpong: yield from bar_sync(2 + c)
                while not fullK[st(cur)].ready(par(cur)): yield
                while not fullV[st(prev)].ready(par(prev)): yield
                if kslot[st(cur)] != cur: errors.append("S(%d) read K %s" % (cur, kslot[st(cur)]))
                if vslot[st(prev)] != prev: errors.append("PV(%d) read V %s" % (prev, vslot[st(prev)]))
                kread[st(cur)].add((c, cur)); vread[st(prev)].add((c, prev))
                if pingpong: named[3 - c].arrive()
                yield
                kread[st(cur)].discard((c, cur)); yield  # S done, softmax
                emptyK[st(cur)].arrive(); yield
                vread[st(prev)].discard((c, prev)); emptyV[st(prev)].arrive(); yield
            emptyQ[qs].arrive(); yield
            last = kv + nb - 1
            while not fullV[st(last)].ready(par(last)): yield
            if vslot[st(last)] != last: errors.append("PV(%d) read V %s" % (last, vslot[st(last)]))
            yield
            emptyV[st(last)].arrive(); yield
            kv += nb; n += 1

    agents = [producer(), consumer(0), consumer(1)]
    alive = [0, 1, 2]; steps = 0
    while alive:
        a = rnd.choice(alive)
        try: next(agents[a])
        except StopIteration: alive.remove(a)
        steps += 1
        if steps > 50000: return ["deadlock %s S%d Q%d" % (tiles, STAGES, QS)]
    return errors

bad = 0
for trial in range(3000):
    r = random.Random(trial)
    tiles = [r.randint(1, 6) for _ in range(r.randint(1, 4))]
    S, Q = r.choice([(2, 1), (2, 2), (4, 2)])
    e = run(tiles, S, Q, trial, pingpong=trial % 4 != 0)
    if e:
        bad += 1
        if bad < 5: print(trial, tiles, S, Q, e[:2])
print("trials with errors:", bad)
