#!/usr/bin/env python3
"""Explicit-state model checker: several replicated logs on the same three stores.

Issue 13 (partitions) lets each store host many logs, each with its own masters, epochs,
fences and HWM. This model asks which store state must be per log. It is quire_mc.py's
failover model (same rules, same properties, same reductions) run for L = 2 logs that
share the stores, the brokers and the network, plus store restarts, which matter once a
store keeps state for more than one log.

HOW TO RUN  (CPython 3.8+, no dependencies; from this directory)
    python3 quire_mc_logs.py --list          # configurations
    python3 quire_mc_logs.py logs-base       # one configuration
    python3 quire_mc_logs.py mut-promise-one-slot --stop-at P2,P4\'   # stop at the first
    sh run_logs.sh                           # all of them, logs in ./out/

MODEL
  3 stores, Qa = 2, F = 2; B brokers. Each log l has its own takeover budget K[l] and client
  values V[l]. A store holds, per log, (promised epoch, entries); every message names its
  log. A broker is, per log, idle, fencing or master (a broker may master one log and
  follow the other). Epochs are 10c + b (counter c, broker b), unique per log, and the same
  number may be used by both logs (each log has its own counters, as partitions do).
  Network, adoption and HWM as in quire_mc.py: messages may be lost, duplicated, reordered.
  A store restart (budget SR) keeps every durable field: in the design it changes nothing.

PROPERTIES (per log; P1-P4' are quire_mc.py's)
  P1   a master adopting a log with epoch e has every entry acked by a lower epoch of that log
  P2   at most one entry is ever acked per offset of a log
  P3   no epoch of a log is used by two takeovers of that log
  P4   nothing new is acked by epoch e of a log after an epoch > e of that log has a fence
       quorum
  P4'  when epoch e acks offset o, every master of a higher epoch of that log that has
       already adopted has the same entry at o
  P7   isolation: a store refuses a master's Append only if that log has seen a takeover with
       a higher epoch (one log's takeover never deposes another log's master)

MUTANTS (each must fail)
  shared-promise     one promised epoch per store for all its logs (a fence of any log raises
                     it): P7 - every takeover deposes the masters of every other log.
  promise-one-slot   promised epochs are kept per log in memory but the store persists a
                     single 'promised' field (the last one raised, whichever log's): after a
                     restart every log's promise is that value, so a log's promise can go
                     back below an epoch it granted a fence to: P4 / P4' / P2.
"""
import re, sys, time
from collections import deque
from itertools import combinations, product

N, QA, F = 3, 2, 2
L = 2
IDLE, FENCING, MASTER = 0, 1, 2

CONFIGS = {
    # K / V: takeovers / client values per log; SR: store restarts; mut: a mutant
    'logs-tiny':         dict(B=2, K=(2, 1), V=(1, 0)),
    'logs-base':         dict(B=2, K=(2, 2), V=(1, 0)),
    'logs-restart':      dict(B=2, K=(2, 1), V=(1, 0), SR=1),
    'logs-values':       dict(B=2, K=(2, 1), V=(1, 1)),
    'mut-shared-promise':   dict(B=2, K=(2, 1), V=(1, 0), mut='shared-promise'),
    'mut-promise-one-slot': dict(B=2, K=(2, 1), V=(1, 0), SR=1, mut='promise-one-slot'),
}


def fmt(log):
    return '[' + ','.join('%d:%s' % (e, 'N' if v == 0 else 'v%d' % v) for e, v in log) + ']'


def upkey(log):
    """'Most up to date': highest last-entry epoch, then highest last offset."""
    return (log[-1][0] if log else 0, len(log))


def replace(t, i, x):
    return t[:i] + (x,) + t[i + 1:]


class Model:
    def __init__(self, B=2, K=(2, 1), V=(1, 0), SR=0, mut=None):
        self.B, self.K, self.V, self.SR, self.mut = B, K, V, SR, mut

    def init(self):
        # store: (per log (promised, entries), slot); slot = the single persisted promise of
        # the 'promise-one-slot' mutant (unused otherwise)
        store = (((0, ()),) * L, 0)
        # broker, per log: (phase, epoch, counter, entries, hwm, start = epoch-start offset)
        broker = ((IDLE, 0, 0, (), -1, -1),) * L
        # ghost per log: acked[o] = (entry, lowest epoch that acked it), values used,
        # takeovers, highest epoch with a fence quorum, epochs used
        ghost = ((((), 0, 0, 0, frozenset()),) * L, 0)   # (per log, store restarts)
        return ((store,) * N, (broker,) * self.B, frozenset(), ghost)

    # ------------------------------------------------------------------ stores
    def raise_promise(self, st, l, e):
        """Store state st with log l's promise raised to at least e."""
        logs, slot = st
        if self.mut == 'shared-promise':            # MUTANT: one promise for every log
            top = max(max(p for p, _ in logs), e)
            return tuple((top, ent) for _, ent in logs), slot
        p, ent = logs[l]
        if e <= p:
            return st
        if self.mut == 'promise-one-slot':          # MUTANT: the last raise is what persists
            slot = e
        return replace(logs, l, (e, ent)), slot

    def deliver_append(self, st, m):
        """Every distinct result of a store in state st receiving snapshot m with some prev."""
        _, l, e, mlog = m
        promised, log = st[0][l]
        if e < promised:
            return []
        res = []
        for p in range(-1, len(mlog)):
            if p >= 0 and (p >= len(log) or log[p][0] != mlog[p][0]):
                continue
            ents, new = mlog[p + 1:], log
            for i, ent in enumerate(ents):
                off = p + 1 + i
                if off >= len(new):
                    new = new + ents[i:]
                    break
                if new[off][0] != ent[0]:
                    new = new[:off] + ents[i:]
                    break
            through = p + len(ents)
            st2 = self.raise_promise(st, l, e)
            st2 = (replace(st2[0], l, (st2[0][l][0], new)), st2[1])
            if all((st2, through) != r[:2] for r in res):
                res.append((st2, through, p))
        return res

    # ------------------------------------------------------------------ masters
    def stabilize(self, l, b, e, log, old, new, brokers, g, viol):
        acked, nv, nt, maxf, used = g
        acked = list(acked) + [None] * (new + 1 - len(acked))
        for o in range(old + 1, new + 1):
            ent = log[o]
            if acked[o] is None:
                if maxf > e:
                    viol.append(('P4', 'log %d: epoch %d acked offset %d=%s after epoch %d had a fence quorum'
                                 % (l, e, o, fmt([ent]), maxf)))
                acked[o] = (ent, e)
            elif acked[o][0] != ent:
                viol.append(('P2', 'log %d: offset %d was acked as %s, now epoch %d acks %s'
                             % (l, o, fmt([acked[o][0]]), e, fmt([ent]))))
            elif acked[o][1] > e:
                acked[o] = (ent, e)
            for b2, br in enumerate(brokers):
                x = br[l]
                if b2 != b and x[0] == MASTER and x[1] > e and (o >= len(x[3]) or x[3][o] != ent):
                    viol.append(("P4'", 'log %d: epoch %d acked offset %d=%s but master of epoch %d already adopted %s'
                                 % (l, e, o, fmt([ent]), x[1], fmt(x[3]))))
        return (tuple(acked), nv, nt, maxf, used)

    # ------------------------------------------------------------------ successors
    def succ(self, state):
        stores, brokers, net, (ghosts, nsr) = state
        out = []

        def with_store(s, st2):
            return replace(stores, s, st2)

        def with_broker(b, l, x):
            return replace(brokers, b, replace(brokers[b], l, x))

        def with_ghost(l, g):
            return (replace(ghosts, l, g), nsr)

        grants, acks = {}, {}
        for m in net:
            k, l = m[0], m[1]
            if k == 'F':
                e = m[2]
                for s, st in enumerate(stores):
                    if e > st[0][l][0]:
                        st2 = self.raise_promise(st, l, e)
                        out.append(('S%d grants Fence(log %d, %d), sends %s' % (s + 1, l, e, fmt(st[0][l][1])),
                                    (with_store(s, st2), brokers, net | {('G', l, e, s, st[0][l][1])},
                                     (ghosts, nsr)), []))
            elif k == 'A':
                e = m[2]
                for s in range(N):
                    promised = stores[s][0][l][0]
                    if e < promised and not any(x > e for x in ghosts[l][4]):
                        out.append(('S%d refuses Append(log %d, e=%d): promised %d' % (s + 1, l, e, promised),
                                    state, [('P7', 'log %d: a store refused epoch %d (promised %d) though no '
                                             'takeover of log %d used a higher epoch' % (l, e, promised, l))]))
                    for st2, through, p in self.deliver_append(stores[s], m):
                        pm = ('P', l, e, s, through)
                        if st2 == stores[s] and pm in net:
                            continue
                        lbl = 'S%d accepts Append(log %d, e=%d, prev=%d, %s) -> %s, Persisted(through=%d)' % (
                            s + 1, l, e, p, fmt(m[3][p + 1:]), fmt(st2[0][l][1]), through)
                        out.append((lbl, (with_store(s, st2), brokers, net | {pm}, (ghosts, nsr)), []))
            elif k == 'G':
                grants.setdefault((l, m[2]), {}).setdefault(m[3], []).append(m[4])
            elif k == 'P':
                d = acks.setdefault((l, m[2]), {})
                d[m[3]] = max(d.get(m[3], -1), m[4])

        for b in range(self.B):
            for l in range(L):
                phase, e, cnt, log, hwm, start = brokers[b][l]
                acked, nvals, nt, maxf, used = ghosts[l]
                if nt < self.K[l]:
                    for c in range(cnt + 1, self.K[l] + 1):
                        ne = 10 * c + b + 1
                        if any(x // 10 == c for x in used):
                            continue
                        out.append(('B%d starts a takeover of log %d with epoch %d' % (b + 1, l, ne),
                                    (stores, with_broker(b, l, (FENCING, ne, c, (), -1, -1)),
                                     net | {('F', l, ne)}, with_ghost(l, (acked, nvals, nt + 1, maxf, used | {ne}))),
                                    []))
                if phase == FENCING:
                    g = grants.get((l, e), {})
                    seen = set()
                    for ss in combinations(sorted(g), F):
                        for logs in product(*(g[s] for s in ss)):
                            best = max(logs, key=lambda x: (upkey(x), x))
                            if best in seen:
                                continue
                            seen.add(best)
                            viol = [('P1', 'log %d: epoch %d adopted %s, missing offset %d=%s acked in epoch %d'
                                     % (l, e, fmt(best), o, fmt([a[0]]), a[1]))
                                    for o, a in enumerate(acked)
                                    if a is not None and a[1] < e and (o >= len(best) or best[o] != a[0])]
                            out.append(('B%d has grants for log %d from %s, adopts %s' % (
                                b + 1, l, '+'.join('S%d' % (s + 1) for s in ss), fmt(best)),
                                (stores, with_broker(b, l, (MASTER, e, cnt, best, -1, -1)),
                                 net | {('A', l, e, best)},
                                 with_ghost(l, (acked, nvals, nt, max(maxf, e), used))), viol))
                if phase != MASTER:
                    continue
                if start < 0:
                    log2 = log + ((e, 0),)
                    out.append(('B%d (log %d, e=%d) appends epoch-start NOOP at offset %d' % (b + 1, l, e, len(log)),
                                (stores, with_broker(b, l, (phase, e, cnt, log2, hwm, len(log))),
                                 net | {('A', l, e, log2)}, (ghosts, nsr)), []))
                elif hwm >= start and nvals < self.V[l]:
                    log2 = log + ((e, nvals + 1),)
                    out.append(('B%d (log %d, e=%d) appends v%d at offset %d' % (b + 1, l, e, nvals + 1, len(log)),
                                (stores, with_broker(b, l, (phase, e, cnt, log2, hwm, start)),
                                 net | {('A', l, e, log2)}, with_ghost(l, (acked, nvals + 1, nt, maxf, used))), []))
                a = acks.get((l, e), {})
                if len(a) >= QA:
                    top = min(sorted(a.values(), reverse=True)[QA - 1], len(log) - 1)
                    for h in range(max(hwm + 1, start if start >= 0 else len(log) + 1), top + 1):
                        viol = []
                        g2 = self.stabilize(l, b, e, log, hwm, h, [br for br in brokers], ghosts[l], viol)
                        out.append(('B%d (log %d, e=%d) has Persisted(through>=%d) from %s -> HWM %d' % (
                            b + 1, l, e, h, '+'.join('S%d' % (s + 1) for s in sorted(a) if a[s] >= h), h),
                            (stores, with_broker(b, l, (phase, e, cnt, log, h, start)), net, with_ghost(l, g2)),
                            viol))

        if nsr < self.SR:                             # a store crashes and restarts
            for s, (logs, slot) in enumerate(stores):
                if self.mut == 'promise-one-slot':    # MUTANT: every log's promise = the slot
                    st2 = (tuple((slot, ent) for _, ent in logs), slot)
                else:
                    st2 = (logs, slot)                # every field is durable: nothing changes
                if st2 != stores[s]:
                    out.append(('S%d restarts: promises now %s' % (s + 1, [p for p, _ in st2[0]]),
                                (with_store(s, st2), brokers, net, (ghosts, nsr + 1)), []))
        return out

    # ------------------------------------------------------------------ reductions
    def normalize(self, state):
        """Drop messages that can never change anything again, then canonicalise store order."""
        stores, brokers, net, ghost = state
        # With the one-slot mutant a restart can lower a promise: keep old fences and appends.
        regress = self.mut == 'promise-one-slot' and ghost[1] < self.SR
        minp = [min(st[0][l][0] for st in stores) for l in range(L)]
        masters = {(l, br[l][1]): br[l][4] for br in brokers for l in range(L) if br[l][0] == MASTER}
        fencing = {(l, br[l][1]) for br in brokers for l in range(L) if br[l][0] == FENCING}
        keep = []
        for m in net:
            k, l = m[0], m[1]
            if k == 'P':
                ok = (l, m[2]) in masters and m[4] > masters[(l, m[2])]
            elif k == 'G':
                ok = (l, m[2]) in fencing
            elif k == 'F':
                ok = regress or m[2] > minp[l]
            else:  # A: kept while some store could still accept it (or refuse it, for P7)
                ok = regress or m[2] >= minp[l] or self.mut == 'shared-promise'
            if ok:
                keep.append(m)
        if len(keep) != len(net):
            net = frozenset(keep)
        order = sorted(range(N), key=lambda i: stores[i])
        if order == list(range(N)):
            return (stores, brokers, net, ghost), None
        inv = [0] * N
        for i, o in enumerate(order):
            inv[o] = i
        stores = tuple(stores[o] for o in order)
        msgs = []
        for m in net:
            if m[0] in ('G', 'P'):
                m = m[:3] + (inv[m[3]],) + m[4:]
            msgs.append(m)
        return (stores, brokers, frozenset(msgs), ghost), order


def check(name, max_states=None, stop_at=None):
    """Breadth-first search of configuration `name`. `stop_at`: a set of property names;
    the search stops once one of them is violated (for mutants: the shortest trace is then
    known, and the rest of the space need not be searched)."""
    cfg = CONFIGS[name]
    M = Model(**cfg)
    s0 = M.init()
    parent = {s0: None}
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
                    if stop_at and p in stop_at:
                        complete = False
            if nxt not in parent:
                parent[nxt] = (st, lbl, order)
                q.append((nxt, d + 1))
                maxdepth = max(maxdepth, d + 1)
        if len(parent) >= nextp:
            nextp += 500000
            print('  ... %d states, depth %d, queue %d, %.0fs' % (len(parent), d, len(q), time.time() - t0),
                  flush=True)
        if max_states and len(parent) > max_states:
            complete = False
            break
        if not complete:
            break
    print('config %s %s' % (name, cfg))
    print('states %d, max depth %d, %.1fs, %s' % (len(parent), maxdepth, time.time() - t0,
                                                  'complete' if complete else
                                                  'INCOMPLETE (stopped at a violation)' if found and stop_at
                                                  else 'INCOMPLETE (state limit)'))
    for p in sorted(found):
        msg, st, last, d = found[p]
        print('\n=== %s VIOLATED (shortest trace, %d steps): %s' % (p, d, msg))
        trace = [(last, None)]
        while parent[st] is not None:
            st, lbl, order = parent[st]
            trace.append((lbl, order))
        names = list(range(N))
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
            print('%-22s %s' % (k, v))
        sys.exit(0)
    check(args[0], int(args[args.index('--max-states') + 1]) if '--max-states' in args else None,
          set(args[args.index('--stop-at') + 1].split(',')) if '--stop-at' in args else None)
