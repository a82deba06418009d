"""The template statistics against the truth counted from the rows they summarise.

The database keeps each template's counters itself (migrations 0012: triggers on t_user_coupon_N
append deltas, quan_template_stat_rollup() folds them into t_template_stat). stats_mismatches
counts the same figures from the coupon rows (how each coupon was issued, its status, first
coupons of a user) and from the settlement rows (every lock is a settlement; cancelled, paid and
refunded ones say what happened to it), both databases, and lists every figure that differs.
The suites that drive a path call it on their templates at the end, so every path that changes
a coupon is checked with real services, and the chaos suite checks it after its faults. A coupon
moved to the archive tables (t_user_coupon_archive_N, services/engine/archive.h) still counts:
the rows are read from both, in one statement per database."""

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


def coupon_tables(ds):
    """The coupon tables of database ds, each shard's hot table and its archive."""
    return ["t_user_coupon%s_%d" % (part, i) for i in range(16 * ds, 16 * ds + 16)
            for part in ("", "_archive")]


def all_truth():
    """The same figures for every template with coupons, counted from the coupon rows (how
    each was issued, its status, first coupons of a user) and the settlement rows (each lock
    made one; cancelled, paid and refunded ones say what became of it)."""
    out = {}
    per_row = ("count(*) FILTER (WHERE channel = 0), count(*) FILTER (WHERE channel = 1), "
               "count(*) FILTER (WHERE channel = 2), count(*) FILTER (WHERE channel = 3), "
               "count(*) FILTER (WHERE channel IS NULL OR channel NOT BETWEEN 0 AND 3), "
               "count(*) FILTER (WHERE receive_count = 1)")
    statuses = ", ".join("count(*) FILTER (WHERE status = %d)" % k for k in range(5))
    names = ("issued_claim", "issued_mq", "issued_dist", "issued_code", "issued_other",
             "new_users", "st_unused", "st_locked", "st_used", "st_expired", "st_revoked")
    for ds in (0, 1):
        q = " UNION ALL ".join(
            "SELECT coupon_template_id, channel, receive_count, status FROM %s" % t
            for t in coupon_tables(ds))
        for r in sql(ds, "SELECT coupon_template_id, %s, %s FROM (%s) c GROUP BY "
                         "coupon_template_id" % (per_row, statuses, q)):
            f = {n: int(v) for n, v in zip(names, r[1:])}
            f["expired"], f["revoked"] = f["st_expired"], f["st_revoked"]
            _add(out, int(r[0]), f)
    # Settlement status: 0 locked, 1 cancelled (unlocked), 2 paid, 3 refunded (paid first).
    settled = []
    for ds, tables in ((0, range(0, 8)), (1, range(8, 16))):
        q = " UNION ALL ".join("SELECT coupon_id, status FROM t_coupon_settlement_%d" % i
                               for i in tables)
        settled += sql(ds, q)
    tpl_of = {}
    for k in range(0, len(settled), 5000):
        ids = ",".join(c for c, _ in settled[k:k + 5000])
        for ds in (0, 1):
            q = " UNION ALL ".join("SELECT id, coupon_template_id FROM %s WHERE id IN (%s)"
                                   % (t, ids) for t in coupon_tables(ds))
            tpl_of.update({c: int(t) for c, t in sql(ds, q)})
    for cid, st in settled:
        if cid not in tpl_of:
            continue  # a test's settlement without its coupon row
        st = int(st)
        _add(out, tpl_of[cid], {"locked": 1, "unlocked": st == 1, "used": st in (2, 3),
                                "refunded": st == 3})
    return out


def known_templates():
    """Every template with coupons or counters now."""
    out = set()
    for ds in (0, 1):
        q = " UNION ".join(["SELECT coupon_template_id FROM t_template_stat",
                            "SELECT coupon_template_id FROM t_template_stat_delta"] +
                           ["SELECT coupon_template_id FROM %s" % t for t in coupon_tables(ds)])
        out |= {int(t) for (t,) in sql(ds, q)}
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


_before = None


def statistics_baseline():
    """A suite's first step: the templates earlier suites left (their fixtures may have written
    rows or counters no real path writes); test_statistics_equal_the_rows checks the others."""
    global _before
    _before = known_templates()


def test_statistics_equal_the_rows():
    """A suite's last test: the counters of every template the suite made equal its rows (all
    the paths it drove)."""
    from quan import check
    mine = known_templates() - (_before or set())
    m = stats_mismatches(mine)
    check(not m, "statistics equal the rows; differing: %s" % "; ".join(m[:20]))
