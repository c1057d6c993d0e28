#!/usr/bin/env python3
"""quire_mc.py with DAMAGED RECORDS: a bit flips in a store's copy of an entry while it runs.

Issue 15 ("corruption repaired from peers"). A store may find one of its entries damaged
(a read fails its checksum); the rules under test (docs/protocol.md, "Damaged records"):
  - a store that knows a damaged entry grants no fence (answers Corrupt), and accepts
    appends as before (its index, which holds every entry's epoch, is intact);
  - a damaged entry is repaired from any other store whose entry at that offset has the
    same epoch (an epoch and an offset name one entry); the store then votes again;
  - an append that truncates at or below a damaged entry replaces it (no longer damaged).
Damage is a store action at any time (at most D damaged entries in the cluster at once);
repair is a store action whenever a same-epoch copy exists (a superset of the master
reading a copy from a store that acked the offset in its epoch).
Mutants that must fail:
  damaged-absent  a damaged store grants, with its log cut before the damaged entry (a
                  scan that stops at a bad record, the BookKeeper #2908 failure)
  repair-any      repair copies another store's entry at that offset whatever its epoch
Everything else is quire_mc.py unchanged (its header follows).

Exhaustive explicit-state model checker for Quire's replication / failover protocol.

HOW TO RUN  (CPython 3.8+ or pypy3, no dependencies; run from this directory)
    python3 quire_mc.py --list               # named configurations and their bounds
    python3 quire_mc.py base                 # one configuration (prints states, time, traces)
    python3 quire_mc.py base --max-states 2000000    # stop early (says INCOMPLETE)
    sh run_all.sh                            # every configuration, logs in ./out/
Breadth-first search over all interleavings with a visited dict (state -> parent), so
every counterexample printed is a SHORTEST one. Properties are checked on every
transition; for each property the first (shortest) violation is printed as a trace.

MODEL SUMMARY (the rules it checks are the ones in ../DESIGN.md)
  N=3 stores, Qa=2, F=2.  Store: durable promised, log = tuple of (epoch, value),
  value 0 = NOOP (epoch-start).  Stores have no volatile state, so a store crash-restart
  without disk loss is a no-op plus message loss; it is not a separate action.
  Network: a set of messages that only grows (messages are dropped only when provably
  dead).  Any message can be delivered any number of times, in any order, or never:
  loss + duplication + reordering.  Fence and Append are broadcasts (any store may get
  them): a superset of point-to-point sends.
  Masters send eagerly: every (log, hwm) a master ever has is in the network as an
  Append snapshot, and a store receiving it picks ANY prev p (entries = log[p+1:]),
  a superset of every nextIndex / retry policy; so rejects carry nothing needed.
  A broker collects no grant / ack state: it adopts when grants from any F distinct
  stores are in the network (any F-subset), and raises its HWM to any h that Qa
  distinct stores have Persisted(epoch=e, through>=h) messages for.  This equals all
  delivery orders of those messages, with fewer intermediate states.
  Broker crash = the broker takes no more steps (safety is prefix-closed), so it is
  not a separate action; a deposed master keeps acting (zombie).  Optional broker
  crash+restart (R) with or without a durable epoch counter.
  Stores are symmetric: states are canonicalised by sorting store states.
PROPERTIES
  P1  a master adopting a log with epoch e has every entry acked by a lower epoch
  P2  at most one entry is ever acked per offset (checked each time any master
      stabilizes an offset, so it also covers the final committed log)
  P3  no epoch is used by two takeovers
  P4  (literal) nothing new is acked by epoch e after some epoch > e has a fence quorum
  P4' (meaningful) when epoch e acks offset o, every master of a higher epoch that has
      already adopted has the same entry at o
"""
import re, sys, time
from collections import deque
from itertools import combinations, product

N, QA, F = 3, 2, 2
VOTER, CATCHUP, RECOVER = 0, 1, 2          # store modes (CATCHUP / RECOVER only after a wipe)
IDLE, FENCING, MASTER = 0, 1, 2            # broker phases

CONFIGS = {
    # D damaged entries at once (0: quire_mc.py's model)
    'damage-tiny':   dict(B=2, K=2, V=1, D=1),
    'damage-v2':     dict(B=2, K=2, V=2, D=1),
    'damage-base':   dict(B=2, K=3, V=1, D=1),
    'damage-d2':     dict(B=2, K=2, V=1, D=2),
    'mut-damaged-absent': dict(B=2, K=2, V=1, D=1, mut='damaged-absent'),
    'mut-repair-any':     dict(B=2, K=3, V=1, D=1, mut='repair-any'),
    # B brokers, K takeovers (epochs), V client values, W store wipes with `rule`,
    # R broker crash-restarts (amnesia: the epoch counter is not durable), mut: design mutants
    'tiny':          dict(B=2, K=2, V=1),
    'base':          dict(B=2, K=3, V=1),
    'base-k2v2':     dict(B=2, K=2, V=2),
    'base-k3v0-b3':  dict(B=3, K=3, V=0),
    'wipe-none':     dict(B=2, K=2, V=1, W=1, rule='none'),
    'wipe-hwm':      dict(B=2, K=2, V=1, W=1, rule='hwm'),
    'wipe-fix':      dict(B=2, K=2, V=1, W=1, rule='fix'),
    'wipe-retire':   dict(B=2, K=2, V=1, W=1, rule='retire'),
    'wipe-retire-k3': dict(B=2, K=3, V=1, W=1, rule='retire'),
    'wipe-retire-v2': dict(B=2, K=2, V=2, W=1, rule='retire'),
    'restart-amnesia': dict(B=2, K=2, V=2, R=1, amnesia=True),
    'restart-durable': dict(B=2, K=2, V=2, R=1, amnesia=False),
    'mut-no-epoch-rule': dict(B=2, K=3, V=1, mut='no-epoch-rule'),  # needs K>=4 to bite
    'mut-through-end':   dict(B=2, K=3, V=1, mut='through-end'),
    'mut-adopt-longest': dict(B=2, K=3, V=2, mut='adopt-longest'),
    'base-k3v2':     dict(B=2, K=3, V=2),
}


def fmt(log):
    return '[' + ','.join('%d:%s' % (e, 'N' if v == 0 else 'v%d' % v) for e, v in log) + ']'


def upkey(log, mut=None):
    """'Most up to date': highest last-entry epoch, then highest last offset."""
    if mut == 'adopt-longest':
        return (len(log), log[-1][0] if log else 0)
    return (log[-1][0] if log else 0, len(log))


class Model:
    def __init__(self, B=2, K=2, V=1, W=0, rule='none', R=0, amnesia=False, mut=None, D=0):
        self.B, self.K, self.V, self.W, self.rule, self.D = B, K, V, W, rule, D
        self.R, self.amnesia, self.mut = R, amnesia, mut
        # With durable counters only the ORDER of epochs matters, so each counter value c
        # is used by one broker only (epoch 10c+b): fewer, equivalent states.
        self.pool = not R

    def init(self):
        store = (0, (), 0, VOTER, 0, frozenset(), frozenset())  # promised, log, incarnation, mode, floor, responders, damaged offsets
        broker = (IDLE, 0, 0, (), -1, -1)           # phase, epoch, counter, log, hwm, start (NOOP offset)
        ghost = ((), 0, 0, 0, 0, 0, frozenset())
        # ghost: acked[o] = (entry, lowest epoch that acked it), client values used,
        #        takeovers, wipes, restarts, highest epoch with a fence quorum, epochs used
        return ((store,) * N, (broker,) * self.B, frozenset(), ghost)

    def mh(self, hwm):                              # stores only use the HWM for the 'hwm' rule
        return hwm if self.rule == 'hwm' else -1

    # ------------------------------------------------------------------ stores
    def deliver_append(self, s, st, m):
        """Every distinct result of store s receiving snapshot m with some prev p."""
        promised, log, inc, mode, floor, rec, dmg = st
        _, e, mlog, hwm = m
        if mode == RECOVER or e < promised:
            return []                                 # reject
        res = []
        for p in range(-1, len(mlog)):
            if p >= 0 and (p >= len(log) or log[p][0] != mlog[p][0]):
                continue                              # no entry with prev's epoch at prev: reject
            ents, new = mlog[p + 1:], log
            cut = len(log)                            # entries from here on are rewritten
            for i, ent in enumerate(ents):
                off = p + 1 + i
                if off >= len(new):
                    new = new + ents[i:]
                    break
                if new[off][0] != ent[0]:             # first conflict: truncate, append the rest
                    new = new[:off] + ents[i:]
                    cut = off
                    break
            through = p + len(ents)
            if self.mut == 'through-end':
                through = len(new) - 1                # MUTANT: ack the store's own log end
            md = mode
            if md == CATCHUP and self.rule == 'hwm' and through >= hwm:
                md = VOTER                            # design: caught up to the HWM the master sent
            if md == CATCHUP and self.rule == 'fix' and through >= 0 and new[through][0] > floor:
                md = VOTER                            # fix: holds the epoch-start of an epoch > floor
            st2 = (max(promised, e), new, inc, md, floor, rec, frozenset(d for d in dmg if d < cut))
            msg = ('P', e, s, through) if md == VOTER else None   # non-voter acks never count
            if all((st2, msg) != r[:2] for r in res):
                res.append((st2, msg, p))
        return res

    # ------------------------------------------------------------------ masters
    def stabilize(self, b, e, log, old, new, brokers, ghost, viol):
        acked, nv, nt, nw, nr, maxf, used = ghost
        acked = list(acked) + [None] * (new + 1 - len(acked))
        for o in range(old + 1, new + 1):
            ent = log[o]
            if acked[o] is None:
                if maxf > e:
                    viol.append(('P4', 'epoch %d acked offset %d=%s after epoch %d had a fence quorum'
                                 % (e, o, fmt([ent]), maxf)))
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
        return (tuple(acked), nv, nt, nw, nr, maxf, used)

    # ------------------------------------------------------------------ successors
    def succ(self, state):
        stores, brokers, net, ghost = state
        acked, nvals, nt, nw, nr, maxf, used = ghost
        out = []

        def with_store(s, st2):
            return stores[:s] + (st2,) + stores[s + 1:]

        def with_broker(b, br2):
            return brokers[:b] + (br2,) + brokers[b + 1:]

        grants, acks = {}, {}                         # per epoch: what brokers may use
        for m in net:
            k = m[0]
            if k == 'F':                              # store grants a fence iff e > promised
                e = m[1]
                for s, (promised, log, inc, mode, floor, rec, dmg) in enumerate(stores):
                    if mode == VOTER and e > promised:
                        glog = log
                        if dmg:
                            if self.mut != 'damaged-absent':
                                continue              # design: no vote while an entry is damaged
                            glog = log[:min(dmg)]     # MUTANT: the damaged entry passes for absent
                        out.append(('S%d grants Fence(%d), sends its log %s' % (s + 1, e, fmt(glog)),
                                    (with_store(s, (e, log, inc, mode, floor, rec, dmg)), brokers,
                                     net | {('G', e, s, glog)}, ghost), []))
            elif k == 'A':
                for s in range(N):
                    for st2, pm, p in self.deliver_append(s, stores[s], m):
                        if st2 == stores[s] and (pm is None or pm in net):
                            continue
                        lbl = 'S%d accepts Append(e=%d, prev=%d, %s%s) -> log %s, %s' % (
                            s + 1, m[1], p, fmt(m[2][p + 1:]), ', hwm=%d' % m[3] if self.rule == 'hwm' else '',
                            fmt(st2[1]), 'Persisted(through=%d)' % pm[3] if pm else 'not a voter yet, no ack')
                        out.append((lbl, (with_store(s, st2), brokers, net | {pm} if pm else net, ghost), []))
            elif k == 'G':
                grants.setdefault(m[1], {}).setdefault(m[2], []).append(m[3])
            elif k == 'P':
                d = acks.setdefault(m[1], {})
                d[m[2]] = max(d.get(m[2], -1), m[3])
            elif k == 'RQ':                           # fix: other voters answer the recovery read
                _, s, inc = m
                for t in range(N):
                    if t != s and stores[t][3] == VOTER and ('RR', s, inc, t, stores[t][0]) not in net:
                        out.append(('S%d answers S%d\'s recovery read: promised=%d' % (t + 1, s + 1, stores[t][0]),
                                    (stores, brokers, net | {('RR', s, inc, t, stores[t][0])}, ghost), []))
            elif k == 'RR':
                _, s, inc, t, pr = m
                promised, log, sinc, mode, floor, rec, dmg = stores[s]
                if sinc == inc and mode == RECOVER and t not in rec:
                    rec, floor = rec | {t}, max(floor, pr)
                    done = len(rec) >= F
                    st2 = (floor if done else promised, log, sinc, CATCHUP if done else RECOVER, floor, rec, dmg)
                    out.append(('S%d gets S%d\'s recovery answer (promised %d)%s' % (
                        s + 1, t + 1, pr, ' -> rejoins as non-voter, promised=floor=%d' % floor if done else ''),
                        (with_store(s, st2), brokers, net, ghost), []))

        for b, (phase, e, cnt, log, hwm, start) in enumerate(brokers):
            if nt < self.K:                           # takeover with a fresh epoch 10c+b
                for c in range(cnt + 1, self.K + 1):
                    ne = 10 * c + b + 1
                    if self.pool and any(x // 10 == c for x in used):
                        continue
                    viol = [('P3', 'epoch %d is used by a second takeover' % ne)] if ne in used else []
                    out.append(('B%d starts a takeover with epoch %d, sends Fence(%d)' % (b + 1, ne, ne),
                                (stores, with_broker(b, (FENCING, ne, c, (), -1, -1)), net | {('F', ne)},
                                 (acked, nvals, nt + 1, nw, nr, maxf, used | {ne})), viol))
            if nr < self.R and phase != IDLE:
                out.append(('B%d crashes and restarts%s' % (b + 1, ', forgetting its epoch counter' if self.amnesia else ''),
                            (stores, with_broker(b, (IDLE, 0, 0 if self.amnesia else cnt, (), -1, -1)), net,
                             (acked, nvals, nt, nw, nr + 1, maxf, used)), []))
            if phase == FENCING:                      # adopt with grants from any F distinct stores
                g = grants.get(e, {})
                seen = set()
                for ss in combinations(sorted(g), F):
                    for logs in product(*(g[s] for s in ss)):
                        best = max(logs, key=lambda l: (upkey(l, self.mut), l))
                        if best in seen:
                            continue
                        seen.add(best)
                        viol = [('P1', 'epoch %d adopted %s, missing offset %d=%s acked in epoch %d'
                                 % (e, fmt(best), o, fmt([a[0]]), a[1]))
                                for o, a in enumerate(acked)
                                if a is not None and a[1] < e and (o >= len(best) or best[o] != a[0])]
                        out.append(('B%d has grants from %s -> fence quorum, adopts %s' % (
                            b + 1, '+'.join('S%d' % (s + 1) for s in ss), fmt(best)),
                            (stores, with_broker(b, (MASTER, e, cnt, best, -1, -1)), net | {('A', e, best, -1)},
                             (acked, nvals, nt, nw, nr, max(maxf, e), used)), viol))
            if phase != MASTER:
                continue
            if start < 0:
                log2 = log + ((e, 0),)
                out.append(('B%d (e=%d) appends epoch-start NOOP at offset %d' % (b + 1, e, len(log)),
                            (stores, with_broker(b, (phase, e, cnt, log2, hwm, len(log))),
                             net | {('A', e, log2, self.mh(hwm))}, ghost), []))
            elif hwm >= start and nvals < self.V:
                log2 = log + ((e, nvals + 1),)
                out.append(('B%d (e=%d) appends client value v%d at offset %d' % (b + 1, e, nvals + 1, len(log)),
                            (stores, with_broker(b, (phase, e, cnt, log2, hwm, start)),
                             net | {('A', e, log2, self.mh(hwm))}, (acked, nvals + 1, nt, nw, nr, maxf, used)), []))
            a = acks.get(e, {})                       # raise HWM: Qa stores acked through >= h
            if len(a) >= QA:
                top = min(sorted(a.values(), reverse=True)[QA - 1], len(log) - 1)
                lo = hwm + 1 if self.mut == 'no-epoch-rule' else max(hwm + 1, start if start >= 0 else len(log) + 1)
                for h in range(lo, top + 1):          # any h up to the Qa-th largest ack (= every delivery order)
                    viol = []
                    g2 = self.stabilize(b, e, log, hwm, h, brokers, ghost, viol)
                    net2 = net | {('A', e, log, h)} if self.rule == 'hwm' else net
                    out.append(('B%d (e=%d) has Persisted(through>=%d) from %s -> HWM %d, acks offsets %d..%d' % (
                        b + 1, e, h, '+'.join('S%d' % (s + 1) for s in sorted(a) if a[s] >= h), h, hwm + 1, h),
                        (stores, with_broker(b, (phase, e, cnt, log, h, start)), net2, g2), viol))

        if nw < self.W:                               # a store loses its disk
            for s, (promised, log, inc, mode, floor, rec, dmg) in enumerate(stores):
                if log or promised:
                    mode0 = {'none': VOTER, 'hwm': CATCHUP, 'fix': RECOVER, 'retire': CATCHUP}[self.rule]
                    net2 = net | {('RQ', s, inc + 1)} if self.rule == 'fix' else net
                    out.append(('S%d is WIPED (disk lost): restarts empty, promised=0, incarnation %d' % (s + 1, inc + 1),
                                (with_store(s, (0, (), inc + 1, mode0, 0, frozenset(), frozenset())), brokers, net2,
                                 (acked, nvals, nt, nw + 1, nr, maxf, used)), []))
        damaged = sum(len(st[6]) for st in stores)
        for s, st in enumerate(stores):
            promised, log, inc, mode, floor, rec, dmg = st
            if damaged < self.D:                      # a bit flips in one of its entries
                for o in range(len(log)):
                    if o not in dmg:
                        out.append(('S%d finds its entry at offset %d (%s) DAMAGED' % (s + 1, o, fmt([log[o]])),
                                    (with_store(s, st[:6] + (dmg | {o},)), brokers, net, ghost), []))
            for o in sorted(dmg):                     # repair from another store's copy
                for t, tst in enumerate(stores):
                    tlog = tst[1]
                    if t == s or o >= len(tlog) or o in tst[6]:
                        continue
                    if self.mut == 'repair-any':
                        log2 = log[:o] + (tlog[o],) + log[o + 1:]   # MUTANT: any epoch
                    elif tlog[o][0] == log[o][0]:
                        log2 = log                    # design: the same entry, byte for byte
                    else:
                        continue
                    out.append(('S%d repairs offset %d from S%d\'s copy %s' % (s + 1, o, t + 1, fmt([tlog[o]])),
                                (with_store(s, (promised, log2, inc, mode, floor, rec, dmg - {o})), brokers, net,
                                 ghost), []))
        return out

    # ------------------------------------------------------------------ reductions
    def normalize(self, state):
        """Drop messages that can never change anything again, then canonicalise store order."""
        stores, brokers, net, ghost = state
        wipes_left = ghost[3] < self.W
        reuse = self.amnesia and ghost[2] < self.K     # an epoch may be reused only with amnesia
        minp = min(st[0] for st in stores)
        masters = {br[1]: br[4] for br in brokers if br[0] == MASTER}
        fencing = {br[1] for br in brokers if br[0] == FENCING}
        keep = []
        for m in net:
            k = m[0]
            if k == 'P':
                ok = reuse or (m[1] in masters and m[3] > masters[m[1]])
            elif k == 'G':
                ok = reuse or m[1] in fencing
            elif k == 'F':
                ok = wipes_left or m[1] > minp
            elif k == 'A':
                ok = wipes_left or m[1] >= minp
            elif k == 'RQ':
                ok = stores[m[1]][2] == m[2] and stores[m[1]][3] == RECOVER
            else:  # RR
                st = stores[m[1]]
                ok = st[2] == m[2] and st[3] == RECOVER and m[3] not in st[5]
            if ok:
                keep.append(m)
        if len(keep) != len(net):
            net = frozenset(keep)
        order = sorted(range(N), key=lambda i: stores[i][:5] + (tuple(sorted(stores[i][6])),))
        if order == list(range(N)):
            return (stores, brokers, net, ghost), None
        inv = [0] * N
        for i, o in enumerate(order):
            inv[o] = i
        stores = tuple(stores[o][:5] + (frozenset(inv[x] for x in stores[o][5]), stores[o][6]) for o in order)
        msgs = []
        for m in net:
            k = m[0]
            if k == 'G' or k == 'P':
                m = m[:2] + (inv[m[2]],) + m[3:]
            elif k == 'RQ':
                m = (k, inv[m[1]], m[2])
            elif k == 'RR':
                m = (k, inv[m[1]], m[2], inv[m[3]], m[4])
            msgs.append(m)
        return (stores, brokers, frozenset(msgs), ghost), order


def check(name, max_states=None):
    cfg = CONFIGS[name]
    M = Model(**cfg)
    s0 = M.init()
    parent = {s0: None}               # state -> (parent state, label, store permutation)
    q = deque([(s0, 0)])
    found = {}
    t0, nextp, maxdepth, complete = time.time(), 500000, 0, True
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
            nextp += 500000
            print('  ... %d states, depth %d, queue %d, %.0fs' % (len(parent), d, len(q), time.time() - t0), flush=True)
        if max_states and len(parent) > max_states:
            complete = False
            break
    print('config %s %s' % (name, cfg))
    print('states %d, max depth %d, %.1fs, %s' % (len(parent), maxdepth, time.time() - t0,
                                                  'complete' if complete else 'INCOMPLETE (state limit)'))
    for p in sorted(found):
        msg, st, last, d = found[p]
        print('\n=== %s VIOLATED (shortest trace, %d steps): %s' % (p, d, msg))
        trace = [(last, None)]
        while parent[st] is not None:
            st, lbl, order = parent[st]
            trace.append((lbl, order))
        names = list(range(N))        # canonical store index -> original store name
        for i, (lbl, order) in enumerate(reversed(trace), 1):
            print('  %2d. %s' % (i, re.sub(r'\bS(\d)\b', lambda g: 'S%d' % (names[int(g.group(1)) - 1] + 1), lbl)))
            if order is not None:
                names = [names[o] for o in order]
    if not found:
        print('no property violated')
    return found


if __name__ == '__main__':
    args = sys.argv[1:]
    if not args or args[0] == '--list':
        for k, v in CONFIGS.items():
            print('%-18s %s' % (k, v))
        sys.exit(0)
    check(args[0], int(args[args.index('--max-states') + 1]) if '--max-states' in args else None)
