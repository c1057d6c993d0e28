#!/usr/bin/env python3
"""Exhaustive explicit-state model checker for Quire's replication / failover protocol,
EXTENDED WITH RETENTION (Trim events = checkpoints, store trims) and the proposed
takeover-from-checkpoint fix.  Derived from quire_mc.py: every original configuration
(T=0) keeps its exact behaviour (same states, same violations); the retention part and the
properties P5 / P5s / P6 are only active when T > 0.  See RETENTION MODEL below.

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

RETENTION MODEL (T > 0)
  Log = tuple of entries; a trimmed / unknown entry is X = (-1, -1); a log's `first` is the
  number of leading X.  Value v < 0 is a Trim event (a checkpoint: ghost = the log prefix
  before it, which in this model determines the broker state) encoded
  v = -(1 + before + 100 * pe), pe = epoch of the entry before the Trim event.
  Master proposes a Trim (at most T in all) only when NOOP stabilized and HWM = log end;
  before = its trim point (max `before` of the Trim events it holds, initially 0) or any
  checkpoint it holds above the trim point (superset of the planner).  Every append carries
  the master's HWM; every HWM raise also sends a snapshot (= heartbeat / next append).
  Store: stable = max over accepted appends of min(hwm, through) (only grows).  A store
  holding a Trim event (t, before) with t <= stable may at any time drop any prefix up to
  min(before, stable) (superset of whole-segment deletion).  Append acceptance: prev below
  the store's first counts as matching; prev beyond the store's end is rejected (a WAL
  cannot start after a gap); prev below the MASTER's start (the master does not hold it):
  prevep='unknown' -> treated as matching, unchecked; prevep='known' -> the store compares
  its entry's epoch with pe recorded in the checkpoint the master starts at.
  Takeover brokers start with an EMPTY log (as after a full broker restart).  If the
  adopted log starts at first > 0: ret='nofix' -> the takeover aborts ("trimmed");
  ret='fix' -> the broker starts its log at the first Trim event c >= first, entries below
  c unknown (X), HWM = c - 1 (treated as stabilized), then NOOP as usual.
  P1  (adapted) for a master starting at c: acked entries at o >= c must be held; o < c is
      fine only if offset c itself is acked with the entry the master holds at c.
  P4' (adapted) an offset below the higher master's start is not compared (P1/P2 cover it)
  P5  (hidden divergence, per accepted append) after a store accepts an append of epoch e
      with through = q, every entry it holds at o <= q equals the master's entry when the
      master holds o, and equals the acked entry (which must exist) when o is below the
      master's start.  This is the "an accepted append means its log equals that master's
      log through `through`" assumption retention relies on.
  P5s (stable is honest, every state) every entry a store holds at first <= o <= stable
      is the acked entry at o, and stable <= its log end.
  P6  (no lost acked entry, every state) a store's first offset f > 0 is at or below the
      `before` of some acked Trim event; every acked entry at o not below such a stabilized
      trim point is held at o by at least Qa stores (implies: never missing from all).
"""
import re, sys, time
from collections import deque
from itertools import combinations, product

N, QA, F = 3, 2, 2
VOTER, CATCHUP, RECOVER = 0, 1, 2          # store modes (CATCHUP / RECOVER only after a wipe)
IDLE, FENCING, MASTER = 0, 1, 2            # broker phases

CONFIGS = {
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
    # ---- retention: T = bound on Trim events, ret = takeover when trimmed, prevep = see docstring
    'retention-nofix':      dict(B=2, K=2, V=1, T=2, ret='nofix'),
    'retention-fix':        dict(B=2, K=2, V=1, T=2, ret='fix'),
    'retention-fix-k3':     dict(B=2, K=3, V=0, T=2, ret='fix'),
    'retention-fix-k3-known': dict(B=2, K=3, V=0, T=2, ret='fix', prevep='known'),
    'retention-nofix-k3':   dict(B=2, K=3, V=0, T=2, ret='nofix'),
    'retention-fix-k4':     dict(B=2, K=4, V=0, T=2, ret='fix'),                     # for --replay only
    'retention-fix-k4-known': dict(B=2, K=4, V=0, T=2, ret='fix', prevep='known'),   # for --replay only
    'mut-trim-unstabilized': dict(B=2, K=2, V=0, T=2, ret='fix', prevep='known', mut='trim-unstabilized'),
    # checkpoints written in parts (2026-12-06): a takeover may start at any checkpoint at or
    # below the highest `before` of the Trim events it adopted (a later first part), not only
    # at the first Trim event (which may be a later part)
    # (T=3: a later checkpoint at or below a `before` needs a third Trim event)
    'retention-fix-parts':  dict(B=2, K=2, V=0, T=3, ret='fix-parts'),
    'mut-parts-above-before': dict(B=2, K=2, V=0, T=3, ret='fix-parts', mut='parts-above-before'),
    'mut-start-any-checkpoint': dict(B=2, K=2, V=1, T=1, ret='fix', prevep='known', mut='start-any-checkpoint'),
}
X = (-1, -1)                                # a trimmed / unknown entry


def first_of(log):
    i = 0
    while i < len(log) and log[i][0] < 0:
        i += 1
    return i


def trim_enc(before, pe):
    return -(1 + before + 100 * pe)


def trim_before(v):
    return (-v - 1) % 100


def trim_pe(v):
    return (-v - 1) // 100


def fmt(log):
    f = first_of(log)
    return '[' + ('<%d trimmed|' % f if f else '') + ','.join(
        '%d:%s' % (e, 'N' if v == 0 else 'v%d' % v if v > 0 else 'T<%d' % trim_before(v)) for e, v in log[f:]) + ']'


def upkey(log, mut=None):
    """'Most up to date': highest last-entry epoch, then highest last offset."""
    if mut == 'adopt-longest':
        return (len(log), log[-1][0] if log else 0)
    return (log[-1][0] if log else 0, len(log))


class Model:
    def __init__(self, B=2, K=2, V=1, W=0, rule='none', R=0, amnesia=False, mut=None,
                 T=0, ret='fix', prevep='unknown', partial=False):
        self.B, self.K, self.V, self.W, self.rule = B, K, V, W, rule
        self.T, self.ret, self.prevep, self.partial = T, ret, prevep, partial
        self.blocked = 0                             # states where a fence quorum cannot adopt (trimmed)
        self.dead = 0                                # states where every store has trimmed
        self.cpstart = 0                             # adoptions that start at a checkpoint (c > 0)
        self.R, self.amnesia, self.mut = R, amnesia, mut
        # With durable counters only the ORDER of epochs matters, so each counter value c
        # is used by one broker only (epoch 10c+b): fewer, equivalent states.
        self.pool = not R

    def init(self):
        store = (0, (), 0, VOTER, 0, frozenset(), -1)  # promised, log, incarnation, mode, floor, responders, stable
        broker = (IDLE, 0, 0, (), -1, -1)           # phase, epoch, counter, log, hwm, start (NOOP offset)
        ghost = ((), 0, 0, 0, 0, 0, frozenset(), 0)
        # ghost: acked[o] = (entry, lowest epoch that acked it), client values used,
        #        takeovers, wipes, restarts, highest epoch with a fence quorum, epochs used, Trim events
        return ((store,) * N, (broker,) * self.B, frozenset(), ghost)

    def mh(self, hwm):                              # stores only use the HWM for the 'hwm' rule
        return hwm if self.rule == 'hwm' or self.T else -1

    # ------------------------------------------------------------------ stores
    def deliver_append(self, s, st, m, acked=()):
        """Every distinct result of store s receiving snapshot m with some prev p (and, with
        `partial`, any range end q).  Returns (store state, Persisted msg, p, q, violations)."""
        promised, log, inc, mode, floor, rec, stable = st
        _, e, mlog, hwm = m
        if mode == RECOVER or e < promised:
            return []                                 # reject
        mstart, sfirst = first_of(mlog), first_of(log)
        res = []
        for p in range(max(-1, mstart - 1), len(mlog)):
            if p >= 0 and p >= sfirst:                # below the store's first: matching
                if p >= len(log):
                    continue                          # the store lacks prev (no gaps in a WAL): reject
                if p < mstart:                        # the master does not hold prev
                    if self.prevep == 'known' and log[p][0] != trim_pe(mlog[mstart][1]):
                        continue
                elif log[p][0] != mlog[p][0]:
                    continue                          # no entry with prev's epoch at prev: reject
            for q in (range(p, len(mlog)) if self.partial else (len(mlog) - 1,)):
                ents, new = mlog[p + 1:q + 1], log
                for i, ent in enumerate(ents):
                    off = p + 1 + i
                    if off < sfirst:
                        continue                      # trimmed on this store
                    if off >= len(new):
                        new = new + ents[i:]
                        break
                    if new[off][0] != ent[0]:         # first conflict: truncate, append the rest
                        new = new[:off] + ents[i:]
                        break
                through = p + len(ents)
                if self.mut == 'through-end':
                    through = len(new) - 1            # MUTANT: ack the store's own log end
                md = mode
                if md == CATCHUP and self.rule == 'hwm' and through >= hwm:
                    md = VOTER                        # design: caught up to the HWM the master sent
                if md == CATCHUP and self.rule == 'fix' and through >= 0 and new[through][0] > floor:
                    md = VOTER                        # fix: holds the epoch-start of an epoch > floor
                st2 = (max(promised, e), new, inc, md, floor, rec,
                       max(stable, min(hwm, through)) if self.T else stable)
                msg = ('P', e, s, through) if md == VOTER else None   # non-voter acks never count
                viol = []
                if self.T:                            # P5: the matched prefix is the master's / the acked log
                    for o in range(sfirst, min(through, len(mlog) - 1) + 1):
                        if o >= mstart:
                            if new[o] != mlog[o]:
                                viol.append(('P5', 'S%d accepted Append(e=%d, prev=%d) but holds %s at offset %d, the master holds %s'
                                             % (s + 1, e, p, fmt([new[o]]), o, fmt([mlog[o]]))))
                                break
                        elif o >= len(acked) or acked[o] is None:
                            viol.append(('P5', 'S%d accepted Append(e=%d, prev=%d) below the master\'s start %d; offset %d (%s) is not acked'
                                         % (s + 1, e, p, mstart, o, fmt([new[o]]))))
                            break
                        elif new[o] != acked[o][0]:
                            viol.append(('P5', 'S%d accepted Append(e=%d, prev=%d) below the master\'s start %d, keeps %s at offset %d acked as %s'
                                         % (s + 1, e, p, mstart, fmt([new[o]]), o, fmt([acked[o][0]]))))
                            break
                if all((st2, msg) != r[:2] for r in res):
                    res.append((st2, msg, p, q, viol))
        return res

    # ------------------------------------------------------------------ masters
    def stabilize(self, b, e, log, old, new, brokers, ghost, viol):
        acked, nv, nt, nw, nr, maxf, used, ntr = ghost
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
                if b2 != b and br[0] == MASTER and br[1] > e and (o >= len(br[3]) or br[3][o] != ent and br[3][o] != X):
                    viol.append(("P4'", 'epoch %d acked offset %d=%s but master of epoch %d already adopted %s'
                                 % (e, o, fmt([ent]), br[1], fmt(br[3]))))
        return (tuple(acked), nv, nt, nw, nr, maxf, used, ntr)

    # ------------------------------------------------------------------ successors
    def succ(self, state):
        stores, brokers, net, ghost = state
        acked, nvals, nt, nw, nr, maxf, used, ntr = ghost
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
                for s, (promised, log, inc, mode, floor, rec, stable) in enumerate(stores):
                    if mode == VOTER and e > promised:
                        out.append(('S%d grants Fence(%d), sends its log %s' % (s + 1, e, fmt(log)),
                                    (with_store(s, (e, log, inc, mode, floor, rec, stable)), brokers,
                                     net | {('G', e, s, log)}, ghost), []))
            elif k == 'A':
                for s in range(N):
                    for st2, pm, p, q, v5 in self.deliver_append(s, stores[s], m, acked):
                        if st2 == stores[s] and (pm is None or pm in net):
                            continue
                        lbl = 'S%d accepts Append(e=%d, prev=%d, %s%s) -> log %s, %s' % (
                            s + 1, m[1], p, fmt(m[2][p + 1:q + 1]), ', hwm=%d' % m[3] if self.rule == 'hwm' or self.T else '',
                            fmt(st2[1]), 'Persisted(through=%d)' % pm[3] if pm else 'not a voter yet, no ack')
                        if self.T:
                            lbl += ', stable=%d' % st2[6]
                        out.append((lbl, (with_store(s, st2), brokers, net | {pm} if pm else net, ghost), v5))
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
                promised, log, sinc, mode, floor, rec, stable = stores[s]
                if sinc == inc and mode == RECOVER and t not in rec:
                    rec, floor = rec | {t}, max(floor, pr)
                    done = len(rec) >= F
                    st2 = (floor if done else promised, log, sinc, CATCHUP if done else RECOVER, floor, rec, stable)
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
                                 (acked, nvals, nt + 1, nw, nr, maxf, used | {ne}, ntr)), viol))
            if nr < self.R and phase != IDLE:
                out.append(('B%d crashes and restarts%s' % (b + 1, ', forgetting its epoch counter' if self.amnesia else ''),
                            (stores, with_broker(b, (IDLE, 0, 0 if self.amnesia else cnt, (), -1, -1)), net,
                             (acked, nvals, nt, nw, nr + 1, maxf, used, ntr)), []))
            if phase == FENCING:                      # adopt with grants from any F distinct stores
                g = grants.get(e, {})
                seen, cands, blocked = set(), 0, 0
                for ss in combinations(sorted(g), F):
                    for logs in product(*(g[s] for s in ss)):
                        best = max(logs, key=lambda l: (upkey(l, self.mut), l))
                        if best in seen:
                            continue
                        seen.add(best)
                        cands += 1
                        c, blog, hwm0, how, alts = 0, best, -1, '', []
                        if self.T:
                            bf = first_of(best)
                            cps = [t for t in range(bf, len(best)) if best[t][1] < 0]
                            if bf > 0 and self.ret == 'nofix':
                                blocked += 1                  # fetch from its own log end (0) is answered "trimmed": abort
                                continue
                            if self.mut == 'start-any-checkpoint' and cps:
                                c = cps[-1]                   # MUTANT: the last checkpoint, stabilized or not
                            elif bf > 0:
                                if not cps:
                                    blocked += 1              # no checkpoint to rebuild from: abort
                                    continue
                                c = cps[0]                    # fix: the first checkpoint at or above first
                                if self.ret == 'fix-parts':
                                    # Checkpoints written in parts: the takeover skips Trim events
                                    # that are later parts and starts at a later first part, which
                                    # lies at or below the trim point the stores trimmed to (the
                                    # `before` of a Trim event). Any such checkpoint is a choice.
                                    top = max(trim_before(best[t][1]) for t in cps)
                                    later = [t for t in cps[1:]
                                             if t <= top or self.mut == 'parts-above-before']   # MUTANT: any later one
                                    alts.extend(later)
                        for c in [c] + alts:
                            blog, hwm0, how = best, -1, ''
                            if self.T and c > 0:
                                blog, hwm0 = (X,) * c + best[c:], c - 1
                                how = ', starts its log at the checkpoint at offset %d (HWM %d)' % (c, c - 1)
                                self.cpstart += 1
                            viol = [('P1', 'epoch %d adopted %s, missing offset %d=%s acked in epoch %d'
                                     % (e, fmt(blog), o, fmt([a[0]]), a[1]))
                                    for o, a in enumerate(acked)
                                    if a is not None and a[1] < e and o >= c and (o >= len(blog) or blog[o] != a[0])]
                            if c > 0 and (c >= len(acked) or acked[c] is None or acked[c][0] != blog[c]):
                                viol.append(('P1', 'epoch %d starts its log at the checkpoint %s at offset %d, which is not acked (acked: %s)'
                                             % (e, fmt([blog[c]]), c, fmt([a[0] if a else X for a in acked]))))
                            out.append(('B%d has grants from %s -> fence quorum, adopts %s%s' % (
                                b + 1, '+'.join('S%d' % (s + 1) for s in ss), fmt(best), how),
                                (stores, with_broker(b, (MASTER, e, cnt, blog, hwm0, -1)), net | {('A', e, blog, self.mh(hwm0))},
                                 (acked, nvals, nt, nw, nr, max(maxf, e), used, ntr)), viol))
                if cands and cands == blocked:
                    self.blocked += 1
            if phase != MASTER:
                continue
            if start < 0:
                log2 = log + ((e, 0),)
                out.append(('B%d (e=%d) appends epoch-start NOOP at offset %d' % (b + 1, e, len(log)),
                            (stores, with_broker(b, (phase, e, cnt, log2, hwm, len(log))),
                             net | {('A', e, log2, self.mh(hwm))}, ghost), []))
            elif self.T and ntr < self.T and hwm >= start and hwm == len(log) - 1:
                cps = [t for t in range(first_of(log), len(log)) if log[t][1] < 0]
                tp = max([trim_before(log[t][1]) for t in cps] + [0])      # the master's trim point
                for bef in sorted({tp} | {t for t in cps if t > tp}):
                    log2 = log + ((e, trim_enc(bef, log[-1][0])),)
                    out.append(('B%d (e=%d) appends Trim(before=%d) = checkpoint at offset %d' % (b + 1, e, bef, len(log)),
                                (stores, with_broker(b, (phase, e, cnt, log2, hwm, start)),
                                 net | {('A', e, log2, self.mh(hwm))}, (acked, nvals, nt, nw, nr, maxf, used, ntr + 1)), []))
            if start >= 0 and hwm >= start and nvals < self.V:
                log2 = log + ((e, nvals + 1),)
                out.append(('B%d (e=%d) appends client value v%d at offset %d' % (b + 1, e, nvals + 1, len(log)),
                            (stores, with_broker(b, (phase, e, cnt, log2, hwm, start)),
                             net | {('A', e, log2, self.mh(hwm))}, (acked, nvals + 1, nt, nw, nr, maxf, used, ntr)), []))
            a = acks.get(e, {})                       # raise HWM: Qa stores acked through >= h
            if len(a) >= QA:
                top = min(sorted(a.values(), reverse=True)[QA - 1], len(log) - 1)
                lo = hwm + 1 if self.mut == 'no-epoch-rule' else max(hwm + 1, start if start >= 0 else len(log) + 1)
                for h in range(lo, top + 1):          # any h up to the Qa-th largest ack (= every delivery order)
                    viol = []
                    g2 = self.stabilize(b, e, log, hwm, h, brokers, ghost, viol)
                    net2 = net | {('A', e, log, h)} if self.rule == 'hwm' or self.T else net
                    out.append(('B%d (e=%d) has Persisted(through>=%d) from %s -> HWM %d, acks offsets %d..%d' % (
                        b + 1, e, h, '+'.join('S%d' % (s + 1) for s in sorted(a) if a[s] >= h), h, hwm + 1, h),
                        (stores, with_broker(b, (phase, e, cnt, log, h, start)), net2, g2), viol))

        if nw < self.W:                               # a store loses its disk
            for s, (promised, log, inc, mode, floor, rec, stable) in enumerate(stores):
                if log or promised:
                    mode0 = {'none': VOTER, 'hwm': CATCHUP, 'fix': RECOVER, 'retire': CATCHUP}[self.rule]
                    net2 = net | {('RQ', s, inc + 1)} if self.rule == 'fix' else net
                    out.append(('S%d is WIPED (disk lost): restarts empty, promised=0, incarnation %d' % (s + 1, inc + 1),
                                (with_store(s, (0, (), inc + 1, mode0, 0, frozenset(), -1)), brokers, net2,
                                 (acked, nvals, nt, nw + 1, nr, maxf, used, ntr)), []))
        if self.T:                                    # a store trims (any prefix up to the point)
            for s, (promised, log, inc, mode, floor, rec, stable) in enumerate(stores):
                sf = first_of(log)
                lim = len(log) - 1 if self.mut == 'trim-unstabilized' else min(stable, len(log) - 1)
                pts = {}
                for t in range(sf, lim + 1):
                    if log[t][1] < 0:
                        bef = trim_before(log[t][1])
                        qmax = bef if self.mut == 'trim-unstabilized' else min(bef, stable)
                        for q in range(sf + 1, qmax + 1):
                            pts.setdefault(q, (t, bef))
                for q in sorted(pts):
                    t, bef = pts[q]
                    out.append(('S%d trims below offset %d (Trim event at %d, before=%d, stable=%d) -> log %s' % (
                        s + 1, q, t, bef, stable, fmt((X,) * q + log[q:])),
                        (with_store(s, (promised, (X,) * q + log[q:], inc, mode, floor, rec, stable)), brokers, net, ghost), []))
        return out

    def state_viol(self, state):
        """Per-state invariants of the retention model: P5s and P6."""
        stores, brokers, net, ghost = state
        acked = ghost[0]
        viol = []
        tps = [trim_before(a[0][1]) for a in acked if a is not None and a[0][1] < 0]
        tp = max(tps + [0])                           # highest stabilized trim point
        if all(first_of(st[1]) > 0 for st in stores):
            self.dead += 1
        for s, st in enumerate(stores):
            log, stable = st[1], st[6]
            f = first_of(log)
            if stable > len(log) - 1:
                viol.append(('P5s', 'S%d has stable=%d beyond its log end %d' % (s + 1, stable, len(log) - 1)))
            for o in range(f, min(stable, len(log) - 1) + 1):
                if o >= len(acked) or acked[o] is None or acked[o][0] != log[o]:
                    viol.append(('P5s', 'S%d has stable=%d but holds %s at offset %d, acked: %s' % (
                        s + 1, stable, fmt([log[o]]), o, fmt([acked[o][0]]) if o < len(acked) and acked[o] else 'nothing')))
                    break
            if f > tp:
                viol.append(('P6', 'S%d trimmed below %d but the highest stabilized trim point is %d' % (s + 1, f, tp)))
        for o, a in enumerate(acked):
            if a is not None and o >= tp:
                n = sum(1 for st in stores if o < len(st[1]) and st[1][o] == a[0])
                if n < QA:
                    viol.append(('P6', 'acked offset %d=%s is held by only %d store(s), not below a stabilized trim point (%d)'
                                 % (o, fmt([a[0]]), n, tp)))
        return viol

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
        order = sorted(range(N), key=lambda i: stores[i][:5] + stores[i][6:])
        if order == list(range(N)):
            return (stores, brokers, net, ghost), None
        inv = [0] * N
        for i, o in enumerate(order):
            inv[o] = i
        stores = tuple(stores[o][:5] + (frozenset(inv[x] for x in stores[o][5]),) + stores[o][6:] for o in order)
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
            raw = nxt
            nxt, order = M.normalize(nxt)
            for p, msg in viol:
                if p not in found:
                    found[p] = (msg, st, lbl, d + 1)
            if nxt not in parent:
                if M.T:
                    for p, msg in M.state_viol(raw):
                        if p not in found:
                            found[p] = (msg, st, lbl, d + 1)
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
    if M.T:
        print('\nobservations: %d states where a fencing broker has a fence quorum but every adoption aborts '
              '(trimmed), %d states where every store has trimmed (first > 0), %d adoptions starting at a checkpoint' % (M.blocked, M.dead, M.cpstart))
    if not found:
        print('no property violated')
    return found


def replay(name, path):
    """Follow a scenario file (one label prefix per line, '#' comments) from the initial
    state WITHOUT store canonicalisation, checking every property on the way: shows that a
    given trace is reachable (used where the exhaustive search cannot reach its depth)."""
    cfg = CONFIGS[name]
    M = Model(**cfg)
    st = M.init()
    print('replay %s on config %s %s' % (path, name, cfg))
    n, bad = 0, []
    for line in open(path):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        n += 1
        nxt = [x for x in M.succ(st) if x[0].startswith(line)]
        if not nxt:
            print('  %2d. NOT ENABLED: %s' % (n, line))
            cands = sorted({x[0] for x in M.succ(st) if x[0].split()[0] == line.split()[0]})
            for c_ in cands[:12]:
                print('        enabled: %s' % c_)
            break
        lbl, st, viol = nxt[0]
        print('  %2d. %s' % (n, lbl))
        for p, msg in viol + (M.state_viol(st) if M.T else []):
            print('      *** %s VIOLATED: %s' % (p, msg))
            bad.append(p)
    print('violated: %s' % (sorted(set(bad)) or 'none'))


if __name__ == '__main__':
    args = sys.argv[1:]
    if args and args[0] == '--replay':
        replay(args[1], args[2])
        sys.exit(0)
    if not args or args[0] == '--list':
        for k, v in CONFIGS.items():
            print('%-18s %s' % (k, v))
        sys.exit(0)
    check(args[0], int(args[args.index('--max-states') + 1]) if '--max-states' in args else None)
