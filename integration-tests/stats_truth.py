"""The template statistics against the truth counted from the rows they summarise.

The database keeps each template's counters itself (migrations 0012: triggers on t_user_coupon_N
append deltas, quan_template_stat_rollup() folds them into t_template_stat). stats_mismatches
counts the same figures from the coupon rows (how each coupon was issued, its status, first
coupons of a user) and from the settlement rows (every lock is a settlement; cancelled, paid and
refunded ones say what happened to it), both databases, and lists every figure that differs.
The suites that drive a path call it on their templates at the end, so every path that changes
a coupon is checked with real services, and the chaos suite checks it after its faults."""

from engine_db import sql

FIGURES = ("issued_claim", "issued_mq", "issued_dist", "issued_code", "issued_other",
           "new_users", "locked", "unlocked", "used", "refunded", "expired", "revoked",
           "st_unused", "st_locked", "st_used", "st_expired", "st_revoked")


def _add(into, tpl, figures):
    row = into.setdefault(tpl, dict.fromkeys(FIGURES, 0))
    for f, v in figures.items():
        row[f] += v


MONEY = ("discount_cents", "refund_discount_cents")


def stats_of_template(tpl):
    """One template's counters and money figures, summed like all_stats."""
    names = FIGURES + MONEY
    out = dict.fromkeys(names, 0)
    for ds in (0, 1):
        row = sql(ds, "SELECT %s FROM (SELECT %s FROM t_template_stat WHERE grain = 0 AND "
                      "coupon_template_id = %d UNION ALL SELECT %s FROM t_template_stat_delta "
                      "WHERE coupon_template_id = %d) x"
                  % (", ".join("coalesce(sum(%s), 0)" % f for f in names), ", ".join(names), tpl,
                     ", ".join(names), tpl))[0]
        for f, v in zip(names, row):
            out[f] += int(v)
    return out


def all_stats():
    """{template: counters} for every template with counters: rolled-up rows plus the deltas
    not rolled up yet, summed over both databases (each database's two parts read in one
    statement, so a rollup running meanwhile moves nothing out of sight)."""
    out = {}
    sums = ", ".join("sum(%s)" % f for f in FIGURES)
    for ds in (0, 1):
        rows = sql(ds, "SELECT coupon_template_id, %s FROM (SELECT coupon_template_id, %s FROM "
                       "t_template_stat WHERE grain = 0 UNION ALL SELECT coupon_template_id, %s "
                       "FROM t_template_stat_delta) x GROUP BY coupon_template_id"
                   % (sums, ", ".join(FIGURES), ", ".join(FIGURES)))
        for r in rows:
            _add(out, int(r[0]), {f: int(v) for f, v in zip(FIGURES, r[1:])})
    return out


def all_truth():
    """The same figures for every template with coupons, counted from the coupon rows (how
    each was issued, its status, first coupons of a user) and the settlement rows (each lock
    made one; cancelled, paid and refunded ones say what became of it)."""
    out, tpl_of = {}, {}
    for ds, tables in ((0, range(0, 16)), (1, range(16, 32))):
        q = " UNION ALL ".join(
            "SELECT id, coupon_template_id, coalesce(channel, -1), status, receive_count FROM "
            "t_user_coupon_%d" % i for i in tables)
        for cid, tpl, ch, st, cnt in sql(ds, q):
            tpl, ch, st = int(tpl), int(ch), int(st)
            tpl_of[cid] = tpl
            f = {("issued_claim", "issued_mq", "issued_dist", "issued_code")[ch]
                 if 0 <= ch <= 3 else "issued_other": 1,
                 ("st_unused", "st_locked", "st_used", "st_expired", "st_revoked")[st]: 1,
                 "new_users": int(cnt) == 1, "expired": st == 3, "revoked": st == 4}
            _add(out, tpl, f)
    # Settlement status: 0 locked, 1 cancelled (unlocked), 2 paid, 3 refunded (paid first).
    for ds, tables in ((0, range(0, 8)), (1, range(8, 16))):
        q = " UNION ALL ".join("SELECT coupon_id, status FROM t_coupon_settlement_%d" % i
                               for i in tables)
        for cid, st in sql(ds, q):
            if cid not in tpl_of:
                continue  # a test's settlement without its coupon row
            st = int(st)
            _add(out, tpl_of[cid], {"locked": 1, "unlocked": st == 1, "used": st in (2, 3),
                                    "refunded": st == 3})
    return out


def stats_mismatches(templates=None):
    """Every figure whose counter differs from the rows, for the given templates (default:
    every template with coupons or counters): ["template T name: counter X, rows Y", ...]."""
    stats, truth = all_stats(), all_truth()
    zero = dict.fromkeys(FIGURES, 0)
    out = []
    for tpl in sorted(templates if templates is not None else set(stats) | set(truth)):
        s, t = stats.get(tpl, zero), truth.get(tpl, zero)
        out += ["template %d %s: counter %d, rows %d" % (tpl, f, s[f], t[f])
                for f in FIGURES if s[f] != t[f]]
    return out


def test_statistics_equal_the_rows():
    """A suite's last test: every template's counters equal its rows (all paths it drove)."""
    from quan import check
    m = stats_mismatches()
    check(not m, "statistics equal the rows; differing: %s" % "; ".join(m[:20]))
