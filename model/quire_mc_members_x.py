#!/usr/bin/env python3
"""quire_mc_members.py EXTENDED (issue 15 item 2): membership changes together with
WIPED STORES replaced through a change, SNAPSHOT start positions, and DAMAGED entries that
are repaired from a peer before the store votes again.

What this file adds to quire_mc_members.py (whose text follows, unchanged where it still
holds; every original configuration explores the same number of states here):
  Store state: (promised, log, dmg, snap, live).
  WIPE (at most W): a store's disk is lost.  Rule under test (DESIGN.md, "Store identity"):
    the wiped identity never acts again (live = 0: no grant, no ack; what it sent before is
    still in the network); the replacement is a NEW identity, S4, which votes only once a
    CFG names it, so replacing S_i is two changes, one store at a time (remove S_i, add S4,
    in either order).  Mutant 'wipe-rejoin': the wiped store comes back under its old
    identity, empty, and votes.
  SNAPSHOT (at most N): a master sends Snapshot(e, log[:x]) with x <= HWM + 1 (a start
    position at or below the stabilized point: the state a checkpoint summarises, with
    the entries below x standing for it).  A store with e >= promised keeps its log if it
    holds the same entry at x - 1, else replaces its whole log with the snapshot; either
    way the entries below its snapshot point `snap` stand for a checkpoint it cannot
    compare: an append takes them as matching (its prev below `snap` always matches, its
    entries below `snap` are skipped), as a Raft follower treats entries covered by its
    snapshot (Raft thesis ch. 5, InstallSnapshot).  It acks through x - 1.  Mutant
    'snap-unstable': x may be anything up to len(log) (a snapshot of entries that are not
    stabilized).
  DAMAGE (at most D at once, from quire_mc_damage.py): a live store finds its entry at an
    offset >= snap damaged; while any entry is damaged it grants no fence (it still takes
    appends); it repairs from any live store whose entry at that offset has the same
    epoch, and votes again; an append that truncates at or below a damaged entry replaces
    it.  Mutant 'damaged-absent': a damaged store grants with its log cut before the
    damaged entry.
  GOALS: so that a configuration is not vacuous, it reports whether these were reached:
    'replaced'   a CFG that excludes a wiped store and includes S4 is stabilized;
    'voted-after-repair'  a store that repaired an entry granted a fence afterwards;
    'snap-voter' an HWM was counted with the ack of a store whose log starts at a snapshot.

Original text:

Exhaustive explicit-state model checker for Quire with MEMBERSHIP CHANGES.

Derived from quire_mc.py (same search, same network / store / broker abstractions; wipes,
broker restarts and the literal P4 are dropped).  Plain CPython 3.8+, no dependencies.
    python3 quire_mc_members.py --list
    python3 quire_mc_members_x.py CONFIG [--max-states N] [--nosym] [--first]
(--first: stop at the first violation found, whose trace is still a shortest one; for mutants)
Breadth-first search over all interleavings, visited dict (state -> parent), so each
counterexample printed is a SHORTEST one; properties are checked on every transition.

MODEL (differences from quire_mc.py)
  Stores S1..S4, all alike: durable promised + log.  Fence(e) granted iff e > promised
  (grant carries the log); Append(e, snapshot) accepted iff e >= promised and prev (any
  p chosen by the network) matches; divergent suffix truncated; ack Persisted(e, s,
  through = p + len(entries)).  Every store acks; whether an ack COUNTS is decided by the
  master's voter set.  S4 starts empty, outside C0 = {S1,S2,S3}.
  Log entry values: 0 = epoch-start NOOP, k > 0 = client value vk, -mask = CFG(set).
  voters(log) = set of the latest CFG in the log (committed or not), else C0.
  Takeover: broker picks a fresh epoch e and a KNOWN set (knowledge mode `know`:
    'any'  = C0 or any set ever appended in a CFG (default; most adversarial),
    'stab' = any set that has been the latest STABILIZED (acked) CFG at some point, or C0).
  Re-fence rule (verified): the broker becomes master with best(H), H = the grants it
    holds for e, iff H contains a majority of KNOWN and a majority of voters(best(H)).
    This is exactly the set of outcomes of the iterative rule "adopt; if the adopted
    log's set differs from the set fenced with, also collect a majority of it, re-adopt
    among all grants held, repeat until stable" (grants only accumulate, nothing else
    in the system observes a FENCING broker, so collapsing the loop into one step at the
    moment it ends loses no behaviour).  H is any subset of the grants in the network
    (grants from stores outside both sets are allowed: more adversarial).
  Master: NOOP first; client values after the NOOP is stabilized; one CFG(C') with
    C' = voters(log) +/- exactly one store (|C'| >= 2) only if NOOP stabilized and no CFG
    in its log is above its HWM; at most M CFGs in total.  HWM rises to h >= NOOP offset
    when a majority of voters(log) acked through >= h in its epoch.
  Mutants: m1 CFG allowed before the NOOP is stabilized (and, since a new master's HWM
    starts at -1, inherited CFGs count as stabilized iff they really were acked: an oracle
    for "the master knows its inherited commit point"); m2 CFG allowed while an earlier
    CFG is unstabilized; m3 no re-fence (majority of KNOWN only); m4 HWM counted in the
    set of the latest CFG at or below the master's own HWM (its stabilized view), else C0.
  Symmetry: permutations of S1,S2,S3 (S4 fixed) preserve C0; states are mapped to a
    representative by sorting S1..S3 on a renaming-invariant key, renaming store ids in
    every message, mask and CFG entry (sound; not always the unique canonical form).
PROPERTIES
  P1  a master adopting a log with epoch e has every entry acked by a lower epoch
  P2  at most one entry is ever acked per offset
  P4' when epoch e acks offset o, every master of a higher epoch that has already
      adopted has the same entry at o
"""
import re, sys, time
from collections import deque
from itertools import combinations

NS = 4
C0 = 0b0111
IDLE, FENCING, MASTER = 0, 1, 2
POP = [bin(m).count('1') for m in range(16)]


def maj(mask):
    return POP[mask] // 2 + 1


def sname(mask):
    return '{' + ','.join('S%d' % (s + 1) for s in range(NS) if mask >> s & 1) + '}'


def fent(e, v):
    return '%d:%s' % (e, 'N' if v == 0 else ('v%d' % v if v > 0 else 'C' + sname(-v)))


def fmt(log):
    return '[' + ','.join(fent(e, v) for e, v in log) + ']'


def voters(log, upto=None):
    """Set of the latest CFG in log[0..upto] (whole log if upto is None), else C0."""
    n = len(log) if upto is None else upto + 1
    for i in range(n - 1, -1, -1):
        v = log[i][1]
        if v < 0:
            return -v
    return C0


def upkey(log):
    return (log[-1][0] if log else 0, len(log), log)


CONFIGS = {
    # B brokers, K takeovers, V client values, M CFG entries in total, know: knowledge mode,
    # mut: mutant, first: restrict the FIRST CFG to this set (directed search, fewer states)
    'k2m1v0':        dict(K=2, M=1, V=0),
    'k2m1v1':        dict(K=2, M=1, V=1),
    'k3m1v0':        dict(K=3, M=1, V=0),
    'k2m2v0':        dict(K=2, M=2, V=0),
    'k2m2v1':        dict(K=2, M=2, V=1),
    'k3m2v0':        dict(K=3, M=2, V=0),
    'k3m2v0-stab':   dict(K=3, M=2, V=0, know='stab'),
    'k3m3v0-add4':   dict(K=3, M=3, V=0, first=0b1111),
    'm1-k3m2v0':     dict(K=3, M=2, V=0, mut='m1'),
    'm1-k3m3v0-add4': dict(K=3, M=3, V=0, mut='m1', first=0b1111),
    'm1-k3m3v0':     dict(K=3, M=3, V=0, mut='m1'),
    'k3m3v0':        dict(K=3, M=3, V=0),
    'm2-k2m2v0':     dict(K=2, M=2, V=0, mut='m2'),
    'm3-k2m2v0':     dict(K=2, M=2, V=0, mut='m3'),
    'm3-k2m2v0-stab': dict(K=2, M=2, V=0, mut='m3', know='stab'),
    'm4-k2m2v0':     dict(K=2, M=2, V=0, mut='m4'),
    'm4-k3m2v0':     dict(K=3, M=2, V=0, mut='m4'),
    # the extension: W wipes, N snapshots, D damaged entries at once
    'wipe-k2m2v0':   dict(K=2, M=2, V=0, W=1),
    'snap-k2m1v0':   dict(K=2, M=1, V=0, N=1),
    'snap-k2m1v1':   dict(K=2, M=1, V=1, N=1),
    'damage-k2m1v0': dict(K=2, M=1, V=0, D=1),
    'all-k2m0v0':    dict(K=2, M=0, V=0, W=1, N=1, D=1),
    'wipe-k2m1v0':   dict(K=2, M=1, V=0, W=1),
    'replace-k2m2v0': dict(K=2, M=2, V=0, W=1, first=0b0110),   # the first change removes S1
    'snap-k2m0v0':   dict(K=2, M=0, V=0, N=1),
    'damage-k2m0v0': dict(K=2, M=0, V=0, D=1),
    'all-k2m1v0':    dict(K=2, M=1, V=0, W=1, N=1, D=1),
    'mut-wipe-rejoin':    dict(K=2, M=0, V=1, W=1, mut='wipe-rejoin'),
    'mut-damaged-absent': dict(K=2, M=1, V=1, D=1, mut='damaged-absent'),
    'mut-snap-unstable':  dict(K=3, M=0, V=1, N=1, mut='snap-unstable'),   # by replay
    'snap-k3m0v1':        dict(K=3, M=0, V=1, N=1),                        # its replay's control
}

PERMS = [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]


class Model:
    def __init__(self, B=2, K=2, V=0, M=1, know='any', mut=None, first=None, sym=True, W=0, N=0, D=0):
        self.B, self.K, self.V, self.M, self.know, self.mut, self.first = B, K, V, M, know, mut, first
        self.W, self.N, self.D = W, N, D
        self.goals = set()
        self.sym = sym
        self.logcache = {}
        # mask maps for each permutation (new index i = old index order[i]; inv[old] = new)
        self.mm = {}
        for order in PERMS:
            inv = [0] * NS
            for i, o in enumerate(order):
                inv[o] = i
            inv[3] = 3
            self.mm[order] = (tuple(inv), [sum(1 << inv[b] for b in range(NS) if m >> b & 1) for m in range(16)])

    def init(self):
        store = (0, (), frozenset(), 0, 1)               # promised, log, damaged offsets, snapshot point, live
        broker = (IDLE, 0, 0, (), -1, -1, 0)             # phase, epoch, counter, log, hwm, start, known
        ghost = ((), 0, 0, (), 1 << C0, 0, 0, 0, 0)
        # acked[o] = (entry, lowest epoch that acked it), client values used, takeovers,
        # CFG masks appended (in order), bitset of sets once latest-stabilized, counters used,
        # wipes used, snapshots used, bitset of stores that repaired an entry
        return ((store,) * NS, (broker,) * self.B, frozenset(), ghost)

    def knowable(self, ghost):
        if self.know == 'stab':
            return [m for m in range(16) if ghost[4] >> m & 1]
        return sorted({C0} | set(ghost[3]))

    # ------------------------------------------------------------------ stores
    def deliver_append(self, st, m):
        promised, log, dmg, snap, live = st
        _, e, mlog = m
        if e < promised or not live:
            return []
        res = []
        for p in range(-1, len(mlog)):
            # Below its snapshot point a store holds a checkpoint, not entries it can
            # compare: it takes that prefix as matching (Raft's InstallSnapshot rule).
            if p >= snap and (p >= len(log) or log[p][0] != mlog[p][0]):
                continue
            ents, new = mlog[p + 1:], log
            cut = len(log)
            for i, ent in enumerate(ents):
                off = p + 1 + i
                if off < snap:
                    continue
                if off >= len(new):
                    new = new + ents[i:]
                    break
                if new[off][0] != ent[0]:
                    new = new[:off] + ents[i:]
                    cut = off
                    break
            through = p + len(ents)
            st2 = (max(promised, e), new, frozenset(d for d in dmg if d < cut), snap, live)
            if all((st2, through) != r[:2] for r in res):
                res.append((st2, through, p))
        return res

    # ------------------------------------------------------------------ masters
    def stabilize(self, b, e, log, old, new, brokers, ghost, viol):
        acked, nv, nt, cfgs, stab, usedc, nw, ns, rep = ghost
        acked = list(acked) + [None] * (new + 1 - len(acked))
        for o in range(old + 1, new + 1):
            ent = log[o]
            if acked[o] is None:
                acked[o] = (ent, e)
            elif acked[o][0] != ent:
                viol.append(('P2', 'offset %d was acked as %s, now epoch %d acks %s'
                             % (o, fmt([acked[o][0]]), e, fmt([ent]))))
            elif acked[o][1] > e:
                acked[o] = (ent, e)
            for b2, br in enumerate(brokers):
                if b2 != b and br[0] == MASTER and br[1] > e and (o >= len(br[3]) or br[3][o] != ent):
                    viol.append(("P4'", 'epoch %d acked offset %d=%s but master of epoch %d already adopted %s'
                                 % (e, o, fmt([ent]), br[1], fmt(br[3]))))
        if self.know == 'stab':
            for a in reversed(acked):
                if a is not None and a[0][1] < 0:
                    stab |= 1 << (-a[0][1])
                    break
        return (tuple(acked), nv, nt, cfgs, stab, usedc, nw, ns, rep)

    # ------------------------------------------------------------------ successors
    def succ(self, state):
        stores, brokers, net, ghost = state
        acked, nvals, nt, cfgs, stab, usedc, nw, ns, repd = ghost
        out = []

        def with_store(s, st2):
            return stores[:s] + (st2,) + stores[s + 1:]

        def with_broker(b, br2):
            return brokers[:b] + (br2,) + brokers[b + 1:]

        grants, acks = {}, {}
        for m in net:
            k = m[0]
            if k == 'G':
                grants.setdefault(m[1], {})[m[2]] = m[3]
            elif k == 'P':
                d = acks.setdefault(m[1], {})
                d[m[2]] = max(d.get(m[2], -1), m[3])
        for m in net:
            k = m[0]
            if k == 'F':
                e = m[1]
                for s, (promised, log, dmg, snap, live) in enumerate(stores):
                    if e > promised and live:
                        glog = log
                        if dmg:
                            if self.mut != 'damaged-absent':
                                continue                 # no vote while an entry is damaged
                            glog = log[:min(dmg)]        # MUTANT: the damaged entry passes for absent
                        if repd >> s & 1:
                            self.goals.add('voted-after-repair')
                        out.append((('grant', s, e, glog),
                                    (with_store(s, (e, log, dmg, snap, live)), brokers,
                                     net | {('G', e, s, glog)}, ghost), []))
            elif k == 'S':
                e, slog = m[1], m[2]
                x = len(slog)
                for s, (promised, log, dmg, snap, live) in enumerate(stores):
                    if e < promised or not live:
                        continue
                    if len(log) >= x and log[x - 1] == slog[x - 1]:
                        st2 = (max(promised, e), log, dmg, max(snap, x), live)
                    else:
                        st2 = (max(promised, e), slog, frozenset(), max(snap, x), live)
                    if st2 == stores[s] and acks.get(e, {}).get(s, -2) >= x - 1:
                        continue
                    out.append((('snapin', s, e, slog, st2[1]),
                                (with_store(s, st2), brokers, net | {('P', e, s, x - 1)}, ghost), []))
            elif k == 'A':
                e = m[1]
                for s in range(NS):
                    old = acks.get(e, {}).get(s, -2)
                    for st2, th, p in self.deliver_append(stores[s], m):
                        if st2 == stores[s] and th <= old:
                            continue
                        out.append((('append', s, e, p, m[2][p + 1:], st2[1], th),
                                    (with_store(s, st2), brokers, net | {('P', e, s, th)}, ghost), []))

        for b, (phase, e, cnt, log, hwm, start, known) in enumerate(brokers):
            if nt < self.K:                               # takeover with a fresh epoch 10c+b
                for c in range(cnt + 1, self.K + 1):
                    if usedc >> c & 1:
                        continue
                    ne = 10 * c + b + 1
                    for kn in self.knowable(ghost):
                        out.append((('takeover', b, ne, kn),
                                    (stores, with_broker(b, (FENCING, ne, c, (), -1, -1, kn)), net | {('F', ne)},
                                     (acked, nvals, nt + 1, cfgs, stab, usedc | 1 << c, nw, ns, repd)), []))
            if phase == FENCING:
                g = grants.get(e, {})
                avail = sorted(g)
                seen = set()
                nk = maj(known)
                for r in range(nk, len(avail) + 1):
                    for H in combinations(avail, r):
                        hm = 0
                        for s in H:
                            hm |= 1 << s
                        if POP[hm & known] < nk:
                            continue
                        best = max((g[s] for s in H), key=upkey)
                        c = voters(best)
                        if self.mut != 'm3' and POP[hm & c] < maj(c):
                            continue
                        if best in seen:
                            continue
                        seen.add(best)
                        viol = [('P1', 'epoch %d adopted %s, missing offset %d=%s acked in epoch %d'
                                 % (e, fmt(best), o, fmt([a[0]]), a[1]))
                                for o, a in enumerate(acked)
                                if a is not None and a[1] < e and (o >= len(best) or best[o] != a[0])]
                        out.append((('adopt', b, e, hm, known, c, best, self.mut != 'm3'),
                                    (stores, with_broker(b, (MASTER, e, cnt, best, -1, -1, 0)),
                                     net | {('A', e, best)}, ghost), viol))
                continue
            if phase != MASTER:
                continue
            cur = voters(log)
            if start < 0:
                log2 = log + ((e, 0),)
                out.append((('noop', b, e, len(log)),
                            (stores, with_broker(b, (phase, e, cnt, log2, hwm, len(log), 0)),
                             net | {('A', e, log2)}, ghost), []))
            else:
                nstab = hwm >= start
                if nstab and nvals < self.V:
                    log2 = log + ((e, nvals + 1),)
                    out.append((('value', b, e, nvals + 1, len(log)),
                                (stores, with_broker(b, (phase, e, cnt, log2, hwm, start, 0)),
                                 net | {('A', e, log2)}, (acked, nvals + 1, nt, cfgs, stab, usedc, nw, ns, repd)), []))
                if self.mut == 'm1':      # inherited CFGs: the master is told truly whether they were acked
                    cfg_ok = all(v >= 0 or (ep != e and o < len(acked) and acked[o] is not None
                                            and acked[o][0] == (ep, v))
                                 for o, (ep, v) in enumerate(log) if o > hwm)
                else:
                    cfg_ok = self.mut == 'm2' or all(v >= 0 for _, v in log[hwm + 1:])
                if len(cfgs) < self.M and (nstab or self.mut == 'm1') and cfg_ok:
                    for s in range(NS):
                        nm = cur ^ (1 << s)
                        if POP[nm] < 2 or (self.first is not None and not cfgs and nm != self.first):
                            continue
                        log2 = log + ((e, -nm),)
                        out.append((('cfg', b, e, nm, len(log), cur),
                                    (stores, with_broker(b, (phase, e, cnt, log2, hwm, start, 0)),
                                     net | {('A', e, log2)}, (acked, nvals, nt, cfgs + (nm,), stab, usedc, nw, ns, repd)), []))
            if start >= 0 and ns < self.N:
                top = len(log) if self.mut == 'snap-unstable' else min(hwm + 1, len(log))
                for x in range(1, top + 1):
                    out.append((('snap', b, e, x),
                                (stores, brokers, net | {('S', e, log[:x])},
                                 (acked, nvals, nt, cfgs, stab, usedc, nw, ns + 1, repd)), []))
            cs = voters(log, hwm) if self.mut == 'm4' else cur
            a = acks.get(e, {})
            q = maj(cs)
            vals = sorted((a[s] for s in a if cs >> s & 1), reverse=True)
            if start >= 0 and len(vals) >= q:
                top = min(vals[q - 1], len(log) - 1)
                for h in range(max(hwm + 1, start), top + 1):
                    viol = []
                    g2 = self.stabilize(b, e, log, hwm, h, brokers, ghost, viol)
                    who = sum(1 << s for s in a if cs >> s & 1 and a[s] >= h)
                    if any(who >> s & 1 and stores[s][3] > 0 for s in range(NS)):
                        self.goals.add('snap-voter')
                    for o in range(hwm + 1, h + 1):
                        v = log[o][1]
                        if v < 0 and -v >> 3 & 1 and any(not stores[s][4] and not (-v >> s & 1) for s in range(NS)):
                            self.goals.add('replaced')
                    out.append((('hwm', b, e, h, who, hwm + 1, cs),
                                (stores, with_broker(b, (phase, e, cnt, log, h, start, 0)), net, g2), viol))
        damaged = sum(len(st[2]) for st in stores)
        for s, st in enumerate(stores):
            promised, log, dmg, snap, live = st
            if not live:
                continue
            if nw < self.W:                              # the disk is lost
                st2 = (0, (), frozenset(), 0, 1 if self.mut == 'wipe-rejoin' else 0)
                out.append((('wipe', s),
                            (with_store(s, st2), brokers, net, (acked, nvals, nt, cfgs, stab, usedc, nw + 1, ns, repd)),
                            []))
            if damaged < self.D:                         # a bit flips in one of its entries
                for o in range(snap, len(log)):
                    if o not in dmg:
                        out.append((('damage', s, o, log[o]),
                                    (with_store(s, (promised, log, dmg | {o}, snap, live)), brokers, net, ghost), []))
            for o in sorted(dmg):                        # repair from a same-epoch copy
                for t, tst in enumerate(stores):
                    tlog = tst[1]
                    if t == s or not tst[4] or o >= len(tlog) or o in tst[2] or tlog[o][0] != log[o][0]:
                        continue
                    out.append((('repair', s, o, t, tlog[o]),
                                (with_store(s, (promised, log, dmg - {o}, snap, live)), brokers, net,
                                 (acked, nvals, nt, cfgs, stab, usedc, nw, ns, repd | 1 << s)), []))
        return out

    # ------------------------------------------------------------------ reductions
    def normalize(self, state):
        stores, brokers, net, ghost = state
        minp = min([st[0] for st in stores if st[4]] or [0])
        masters = {br[1]: br[4] for br in brokers if br[0] == MASTER}
        fencing = {br[1] for br in brokers if br[0] == FENCING}
        top = {}
        for m in net:
            if m[0] == 'P' and m[3] > top.get((m[1], m[2]), -9):
                top[(m[1], m[2])] = m[3]
        keep = []
        for m in net:
            k = m[0]
            if k == 'P':
                ok = m[1] in masters and m[3] > masters[m[1]] and top[(m[1], m[2])] == m[3]
            elif k == 'G':
                ok = m[1] in fencing
            elif k == 'F':
                ok = m[1] > minp
            else:
                ok = m[1] >= minp
            if ok:
                keep.append(m)
        if len(keep) != len(net):
            net = frozenset(keep)
        if not self.sym:
            return (stores, brokers, net, ghost), None
        cfgs = ghost[3]

        def key(i):
            pr, log, dmg, snap, live = stores[i]
            return (tuple(c >> i & 1 for c in cfgs), pr, live, snap, tuple(sorted(dmg)), ghost[8] >> i & 1,
                    tuple((e, v) if v >= 0 else (e, -100 - POP[-v] - 10 * (-v >> 3 & 1) - 5 * (-v >> i & 1))
                          for e, v in log))
        order = tuple(sorted(range(3), key=key))
        if order == (0, 1, 2):
            return (stores, brokers, net, ghost), None
        inv, mm = self.mm[order]
        cache = self.logcache

        def rl(log):
            kk = (order, log)
            r = cache.get(kk)
            if r is None:
                r = tuple((e, -mm[-v]) if v < 0 else (e, v) for e, v in log)
                cache[kk] = r
            return r
        stores = tuple((stores[o][0], rl(stores[o][1])) + stores[o][2:] for o in order) + \
            ((stores[3][0], rl(stores[3][1])) + stores[3][2:],)
        brokers = tuple((ph, e, c, rl(lg), h, st, mm[kn]) for ph, e, c, lg, h, st, kn in brokers)
        msgs = []
        for m in net:
            k = m[0]
            if k == 'G':
                m = ('G', m[1], inv[m[2]], rl(m[3]))
            elif k == 'P':
                m = ('P', m[1], inv[m[2]], m[3])
            elif k in ('A', 'S'):
                m = (k, m[1], rl(m[2]))
            msgs.append(m)
        acked, nv, nt, cf, stab, usedc, nw, ns, repd = ghost
        acked = tuple(((a[0][0], -mm[-a[0][1]]) if a[0][1] < 0 else a[0], a[1]) for a in acked)
        stab2 = 0
        for x in range(16):
            if stab >> x & 1:
                stab2 |= 1 << mm[x]
        repd2 = sum(1 << inv[s] for s in range(NS) if repd >> s & 1)
        ghost = (acked, nv, nt, tuple(mm[x] for x in cf), stab2, usedc, nw, ns, repd2)
        return (stores, brokers, frozenset(msgs), ghost), order


def render(l):
    k = l[0]
    if k == 'grant':
        _, s, e, log = l
        return 'S%d grants Fence(%d), sends its log %s' % (s + 1, e, fmt(log))
    if k == 'append':
        _, s, e, p, ents, new, th = l
        return 'S%d accepts Append(e=%d, prev=%d, %s) -> log %s, Persisted(through=%d)' % (
            s + 1, e, p, fmt(ents), fmt(new), th)
    if k == 'takeover':
        _, b, ne, kn = l
        return 'B%d starts a takeover with epoch %d knowing voter set %s, sends Fence(%d)' % (b + 1, ne, sname(kn), ne)
    if k == 'adopt':
        _, b, e, hm, kn, c, best, refence = l
        return 'B%d holds grants from %s (majority of known %s%s) -> adopts %s, becomes master' % (
            b + 1, sname(hm), sname(kn), '' if c == kn else (' and of adopted set %s' % sname(c) if refence else
                                                              '; adopted set %s NOT checked (m3)' % sname(c)), fmt(best))
    if k == 'noop':
        _, b, e, off = l
        return 'B%d (e=%d) appends epoch-start NOOP at offset %d' % (b + 1, e, off)
    if k == 'value':
        _, b, e, v, off = l
        return 'B%d (e=%d) appends client value v%d at offset %d' % (b + 1, e, v, off)
    if k == 'cfg':
        _, b, e, nm, off, cur = l
        return 'B%d (e=%d) appends CFG%s at offset %d (was %s)' % (b + 1, e, sname(nm), off, sname(cur))
    if k == 'hwm':
        _, b, e, h, who, lo, cs = l
        return 'B%d (e=%d) has Persisted(through>=%d) from %s (majority of %s) -> HWM %d, acks offsets %d..%d' % (
            b + 1, e, h, sname(who), sname(cs), h, lo, h)
    if k == 'snap':
        _, b, e, x = l
        return 'B%d (e=%d) sends Snapshot of offsets 0..%d' % (b + 1, e, x - 1)
    if k == 'snapin':
        _, s, e, slog, new = l
        return 'S%d installs Snapshot(e=%d, %s) -> log %s, Persisted(through=%d)' % (s + 1, e, fmt(slog), fmt(new), len(slog) - 1)
    if k == 'wipe':
        return 'S%d is WIPED' % (l[1] + 1)
    if k == 'damage':
        _, s, o, ent = l
        return 'S%d finds its entry at offset %d (%s) DAMAGED' % (s + 1, o, fmt([ent]))
    if k == 'repair':
        _, s, o, t, ent = l
        return "S%d repairs offset %d from S%d's copy %s" % (s + 1, o, t + 1, fmt([ent]))
    return repr(l)


def check(name, max_states=None, sym=True, first=False):
    cfg = CONFIGS[name]
    M = Model(sym=sym, **cfg)
    s0 = M.init()
    parent = {s0: None}
    q = deque([(s0, 0)])
    found = {}
    t0, nextp, maxdepth, complete = time.time(), 250000, 0, True
    while q:
        st, d = q.popleft()
        for lbl, nxt, viol in M.succ(st):
            nxt, order = M.normalize(nxt)
            for p, msg in viol:
                if p not in found:
                    found[p] = (msg, st, lbl, d + 1)
            if nxt not in parent:
                parent[nxt] = (st, lbl, order)
                q.append((nxt, d + 1))
                maxdepth = max(maxdepth, d + 1)
        if len(parent) >= nextp:
            nextp += 250000
            print('  ... %d states, depth %d, queue %d, %.0fs' % (len(parent), d, len(q), time.time() - t0), flush=True)
        if max_states and len(parent) > max_states or first and found:
            complete = False
            stopped = 'stopped at the first violation' if first and found else 'state limit'
            break
    print('config %s %s%s' % (name, cfg, '' if sym else ' (no symmetry)'))
    print('states %d, max depth %d, %.1fs, %s' % (len(parent), maxdepth, time.time() - t0,
                                                  'complete' if complete else 'INCOMPLETE (%s, depth reached %d)' % (stopped, d)))
    for p in sorted(found):
        msg, st, last, d = found[p]
        trace = [(last, None)]
        cur = st
        while parent[cur] is not None:
            cur, lbl, order = parent[cur]
            trace.append((lbl, order))
        names = list(range(NS))

        def tr(text):
            text = re.sub(r'\bS(\d)\b', lambda g: 'S%d' % (names[int(g.group(1)) - 1] + 1), text)
            return re.sub(r'\{([S0-9,]*)\}', lambda g: '{' + ','.join(sorted(g.group(1).split(','))) + '}', text)
        lines = []
        for i, (lbl, order) in enumerate(reversed(trace), 1):
            lines.append('  %2d. %s' % (i, tr(render(lbl))))
            if order is not None:
                names = [names[o] for o in order] + [3]
        print('\n=== %s VIOLATED (shortest trace, %d steps): %s' % (p, d, tr(msg)))
        print('\n'.join(lines))
        print('  state before the last step:')
        for i, (pr, log, dmg, snap, live) in enumerate(st[0]):
            print('    %s' % tr('S%d promised=%d log=%s damaged=%s snap=%d%s' % (
                i + 1, pr, fmt(log), sorted(dmg), snap, '' if live else ' WIPED')))
        print('    ghost acked=%s' % tr(' '.join('%d:%s@%d' % (o, fmt([a[0]]), a[1]) for o, a in enumerate(st[3][0]))))
    if M.W or M.N or M.D:
        print('goals reached: %s' % (', '.join(sorted(M.goals)) or 'none'))
    if not found:
        print('no property violated')
    sys.stdout.flush()
    return found


def replay(name, path):
    """Walk ONE execution: each line of `path` is a substring that the next step's label must
    contain (no symmetry, original store names).  Validates a hand-written scenario."""
    M = Model(sym=False, **CONFIGS[name])
    st = M.init()
    steps = [l.rstrip('\n') for l in open(path) if l.strip() and not l.startswith('#')]
    print('replay %s %s on config %s %s' % (path, len(steps), name, CONFIGS[name]))
    hit = False
    for i, pat in enumerate(steps, 1):
        cands = [(l, n, v) for l, n, v in M.succ(st) if pat in render(l)]
        if not cands:
            print('  %2d. BLOCKED: no enabled step matches %r' % (i, pat))
            return hit
        lbl, nxt, viol = cands[0]
        print('  %2d. %s' % (i, render(lbl)))
        for p, msg in viol:
            print('      *** %s VIOLATED: %s' % (p, msg))
            hit = True
        st = M.normalize(nxt)[0]
    print('  end of scenario; %s' % ('a property was violated' if hit else 'no property violated'))
    return hit


if __name__ == '__main__':
    args = sys.argv[1:]
    if not args or args[0] == '--list':
        for k, v in CONFIGS.items():
            print('%-18s %s' % (k, v))
        sys.exit(0)
    if '--replay' in args:
        replay(args[0], args[args.index('--replay') + 1])
        sys.exit(0)
    check(args[0], int(args[args.index('--max-states') + 1]) if '--max-states' in args else None,
          sym='--nosym' not in args, first='--first' in args)
