#!/usr/bin/env bash
# The coupon archive against the hot paths (services/engine/archive.h). Two groups of
# BENCH_ARCHIVE_USERS users (500) with 10 unused coupons each, each group in a shard of its own in
# ds_0: the control group in t_user_coupon_6, the other in t_user_coupon_5, where each of its
# users then gets 100 dead coupons (used and expired, of an ended template, dead for a year: 10x
# as many dead as live), which `quan-archive run` then moves out. Before and after the move, one
# client in turn (latency, not throughput), its requests alternating between the two groups so
# that both meet the same machine (shared, its load changing):
#   wallet    GET  /user-coupon/list (every status, newest first)
#   settle    POST /settlement/coupon-query (settlement's kept rows off: the database each time)
#   pay       GET /user-coupon/list?status=0, then POST /create-payment-record and
#             /process-payment of one of the user's unused coupons
#   claim     POST /user-coupon/redeem of the live template
# and prints the mean time of each for each group; the goal: after archiving the dead coupons'
# group as fast as the control group (within 15 %). Part of `make bench` (a minute and a half);
# results in docs/benchmarks.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
users=${BENCH_ARCHIVE_USERS:-500}
shard=5   # the dead coupons' group, t_user_coupon_5 (ds_0)
control=6 # the control group, t_user_coupon_6 (ds_0)

# shellcheck source=bench/lib.sh
. bench/lib.sh
# shellcheck source=bench/goals.sh
. bench/goals.sh
bench_init quan-archive-bench
bench_start_engine QUAN_ARCHIVE_INTERVAL_MS=0
settle_port=$(bench_free_port)
bench_start_service settlement "$settle_port" QUAN_LOG_LEVEL=warn QUAN_CQ_CACHE_USERS=0

shop=1810714735922956666
live=7100000000000001
dead=7100000000000002
bench_template "$live" "$shop" 10000000 0 1 '' '{"maximumDiscountAmount":5,"validityPeriod":48}' 1000
read -r tds ttable < <(bench_shard t_coupon_template 16 "$shop")
tdsn="QUAN_DS${tds}_DSN"
psql "${!tdsn}" -qAtX -v ON_ERROR_STOP=1 -c "INSERT INTO $ttable (id, name, shop_number, source,
    target, type, valid_start_time, valid_end_time, stock, receive_rule, consume_rule, status)
    VALUES ($dead, 'bench ended', $shop, 0, 1, 0, now() - interval '400 days',
    now() - interval '300 days', 0, '{\"limitPerPerson\":1000}',
    '{\"maximumDiscountAmount\":5,\"validityPeriod\":48}', 1)" >/dev/null

# The users of each group, one a line.
for g in "$shard" "$control"; do
    /usr/bin/python3 - "$users" "$g" >"$dir/users.$g" <<'PY'
import sys
n, shard = int(sys.argv[1]), int(sys.argv[2])
u = 5_000_000_000
while n:
    u += 1
    v = u & 0xFFFFFFFFFFFFFFFF
    h = (v ^ (v >> 32)) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    if abs(h) % 32 == shard:
        print(u)
        n -= 1
PY
    psql "$QUAN_DS0_DSN" -qAtX -v ON_ERROR_STOP=1 -c "INSERT INTO t_user_coupon_$g (id, user_id,
        coupon_template_id, shop_number, receive_count, valid_start_time, valid_end_time,
        status, channel) SELECT 72000000000${g}0000 + row_number() OVER (), u, $live, $shop, k,
        now() - interval '1 hour', now() + interval '30 days', 0, 0 FROM
        unnest('{$(paste -sd, "$dir/users.$g")}'::bigint[]) u, generate_series(1, 10) k" >/dev/null
    # The claim counters of the live template: 10 each, as the claims that made them would have.
    while read -r u; do printf 'HSET quan:tpl:{%s}:users %s 10\n' "$live" "$u"; done \
        <"$dir/users.$g" | redis-cli -p "$QUAN_REDIS_PORT" >/dev/null
done
ids="{$(paste -sd, "$dir/users.$shard")}"

# measure: the mean time of each path for the dead coupons' group and the control group,
# "op ms ms" a line.
measure() {
    /usr/bin/python3 - "$port" "$settle_port" "$shop" "$live" "$dir/users.$shard" \
        "$dir/users.$control" <<'PY'
import http.client, json, sys, time
eport, sport, shop, live = sys.argv[1:5]
groups = [[int(x) for x in open(f)] for f in sys.argv[5:7]]
eng = http.client.HTTPConnection("127.0.0.1", int(eport))
stl = http.client.HTTPConnection("127.0.0.1", int(sport))

def call(conn, method, path, user, body=None):
    h = {"X-User-Id": str(user), "Content-Type": "application/json"}
    conn.request(method, path, json.dumps(body) if body is not None else None, h)
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise SystemExit("%s %s: %s %s" % (method, path, r.status, data[:200]))
    return json.loads(data)["data"]

order = [0]
def pay(u):
    coupons = [c for c in call(eng, "GET", "/api/engine/user-coupon/list?status=0", u)
               if c["couponTemplateId"] == live]
    c = coupons[0]["userCouponId"]
    order[0] += 1
    o = str(int(time.time() * 1000) * 1000 + order[0])
    call(eng, "POST", "/api/engine/user-coupon/create-payment-record", u,
         {"couponId": c, "orderId": o, "orderAmount": 20, "payableAmount": 15,
          "shopNumber": shop, "goodsList": []})
    call(eng, "POST", "/api/engine/user-coupon/process-payment", u, {"couponId": c, "orderId": o})

ops = [("wallet", lambda u: call(eng, "GET", "/api/engine/user-coupon/list", u), 1000),
       ("settle", lambda u: call(stl, "POST", "/api/settlement/coupon-query", u,
                                 {"orderAmount": 150, "shopNumber": shop}), 1000),
       ("pay", pay, 200),
       ("claim", lambda u: call(eng, "POST", "/api/engine/user-coupon/redeem", u,
                                {"shopNumber": shop, "couponTemplateId": live}), 400)]
for name, fn, n in ops:
    spent = [0.0, 0.0]
    for i in range(n + 20):  # the first 20 of each group warm up (connections, plans)
        for g in (0, 1):
            t0 = time.perf_counter()
            fn(groups[g][i % len(groups[g])])
            if i >= 20:
                spent[g] += time.perf_counter() - t0
    print("%s %.3f %.3f" % (name, spent[0] * 1000 / n, spent[1] * 1000 / n))
PY
}

rows() { psql "$QUAN_DS0_DSN" -qAtX -c "SELECT count(*) FROM t_user_coupon_$1"; }

# 100 dead coupons a user of the group: 60 used, 40 expired, dead for a year.
psql "$QUAN_DS0_DSN" -qAtX -v ON_ERROR_STOP=1 -c "INSERT INTO t_user_coupon_$shard (id, user_id,
    coupon_template_id, shop_number, receive_count, receive_time, valid_start_time,
    valid_end_time, status, channel, update_time) SELECT 7300000000000000 + row_number() OVER (),
    u, $dead, $shop, k, now() - interval '400 days', now() - interval '400 days', now() -
    interval '398 days', CASE WHEN k % 5 < 3 THEN 2 ELSE 3 END, 0, now() - interval '365 days'
    FROM unnest('$ids'::bigint[]) u, generate_series(1, 100) k" >/dev/null
psql "$QUAN_DS0_DSN" -qAtX -c "VACUUM ANALYZE t_user_coupon_$shard" >/dev/null
declare -A ms
for state in dead archived; do
    if [ "$state" = archived ]; then
        build/bin/quan-archive run --after-days 180 >"$dir/archive.out"
        psql "$QUAN_DS0_DSN" -qAtX -c "VACUUM ANALYZE t_user_coupon_$shard" >/dev/null
    fi
    echo "$state: t_user_coupon_$shard $(rows "$shard") rows, control t_user_coupon_$control $(rows "$control") rows"
    printf '  %-8s %14s %14s %7s\n' path "group ms" "control ms" ratio
    while read -r op a b; do
        ms[$state.$op]=$a
        ms[$state.$op.control]=$b
        printf '  %-8s %14s %14s %7.2f\n' "$op" "$a" "$b" "$(echo "$a / $b" | bc -l)"
    done < <(measure)
done
sed 's/^/quan-archive: /' "$dir/archive.out"
for op in wallet settle pay claim; do
    bench_figure "archive: $op, 10x dead coupons (ms)" "${ms[dead.$op]}" ms \
        "control group" "${ms[dead.$op.control]}"
    bench_goal "archive: $op, after archiving (ms, lower is better)" "${ms[archived.$op]}" ms \
        "control group" "${ms[archived.$op.control]}" "<=" 1.15
done
