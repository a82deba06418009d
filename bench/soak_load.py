#!/usr/bin/python3
"""Mixed load for bench/soak.sh: a steady, moderate rate of requests through the public HTTP API
of all four services for SECONDS, from a few threads, each pacing its own requests and keeping one
keep-alive connection per service (so the services' connection counts stay put unless they
leak). The point is leaks, not speed: about 270 requests/s in all (--scale multiplies the rates).

  merchant-admin  template create (a fresh one every 30 s, 1,800 coupons: claims and tasks
                  take about 2,000 in that time, so sold-out refusals are part of the mix), find,
                  page;
                  exchange-code batches (20 codes a minute: create, find until ready, export);
                  distribution tasks (coupon-task/create of a 200-row sheet every 30 s, find)
  engine          template query; claims, half /redeem, half /redeem-mq and later its
                  /redeem-result; wallet list; payment lock, commit, refund (or cancel) of claimed
                  coupons; reminders create, list, cancel; exchange of the batches' codes
  settlement      coupon-query for users who hold coupons
  distribution    runs the tasks (no API of its own)

At the end it prints, per service, the requests answered 2xx, 4xx, 5xx and those that got no
answer, the most frequent non-2xx answers, and the distribution tasks that did not succeed; the
totals also go to --out as "service 2xx 4xx 5xx errors" lines (with a "tasks ok failed" line).
  soak_load.py --ma URL --engine URL --settlement URL --files DIR --seconds N --out FILE"""

import argparse
import collections
import http.client
import io
import json
import random
import re
import sys
import threading
import time
import urllib.parse
import zipfile

SHOP = "1810714735922956666"
MERCHANT = {"X-User-Id": "1", "X-Shop-Number": SHOP}
CODE_RE = re.compile(rb">([2-9A-HJ-NP-Z]{10})<")


def rfc3339(offset_s):
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() + offset_s))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_class = collections.defaultdict(collections.Counter)  # service -> class -> n
        self.routes = collections.Counter()  # (service, route) -> n
        self.non2xx = collections.Counter()  # (service, route, status, code) -> n
        self.results = collections.Counter()  # redeem-result status -> n
        self.samples_5xx = []
        self.tasks = collections.Counter()

    def record(self, svc, route, status, body):
        cls = "err" if status is None else "%dxx" % (status // 100)
        with self.lock:
            self.by_class[svc][cls] += 1
            self.routes[(svc, route)] += 1
            if cls != "2xx":
                code = body.get("code") if isinstance(body, dict) else None
                self.non2xx[(svc, route, status, code)] += 1
                if cls in ("5xx", "err") and len(self.samples_5xx) < 10:
                    self.samples_5xx.append((svc, route, status, str(body)[:200]))


class Client:
    """One thread's keep-alive connections, one per service."""

    def __init__(self, stats, urls):
        self.stats = stats
        self.urls = urls  # service -> (host, port, path prefix)
        self.conns = {}

    def call(self, svc, route, method, path, body=None, headers=None, query=None):
        """(status, parsed JSON or raw bytes); status None when no answer came."""
        host, port, prefix = self.urls[svc]
        url = prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        hdrs = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        for attempt in (0, 1):
            conn = self.conns.get(svc)
            reused = conn is not None
            if conn is None:
                conn = self.conns[svc] = http.client.HTTPConnection(host, port, timeout=30)
            try:
                conn.request(method, url, data, hdrs)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
                break
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                del self.conns[svc]
                # A keep-alive connection the server closed while idle: the next one is fresh.
                if reused and attempt == 0:
                    continue
                self.stats.record(svc, route, None, repr(e))
                return None, None
        try:
            parsed = json.loads(raw) if raw[:1] == b"{" else raw
        except ValueError:
            parsed = raw
        self.stats.record(svc, route, status, parsed)
        return status, parsed


def data_of(js):
    return js.get("data") if isinstance(js, dict) else None


class State:
    """What the threads share: templates, users and the coupons they hold."""

    def __init__(self):
        self.lock = threading.Lock()
        self.claim_templates = collections.deque(maxlen=5)  # newest last
        self.remind_template = None
        self.exchange_template = None
        base = random.randrange(1 << 40, 1 << 50)
        self.users = [base + i for i in range(5000)]
        self.holders = collections.deque(maxlen=2000)  # (user, userCouponId), unused
        self.mq_pending = collections.deque(maxlen=10000)  # (time, user, requestId)
        self.codes = collections.deque(maxlen=1000)

    def claim_template(self):
        with self.lock:
            return self.claim_templates[-1]

    def some_template(self):
        with self.lock:
            return random.choice(self.claim_templates)

    def user(self):
        return random.choice(self.users)


def paced(rate, stop):
    """Yields at `rate` per second until stop is set (a late tick does not cause a burst)."""
    interval = 1.0 / rate
    nxt = time.monotonic()
    while not stop.is_set():
        yield
        nxt += interval
        delay = nxt - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        elif delay < -1:
            nxt = time.monotonic()


def create_template(cli, name, stock, start_offset_s):
    body = {"name": name, "source": 0, "target": 1, "type": 0,
            "validStartTime": rfc3339(start_offset_s), "validEndTime": rfc3339(30 * 86400),
            "stock": stock, "receiveRule": {"limitPerPerson": 5, "usageInstructions": "soak"},
            "consumeRule": {"termsOfUse": 0, "maximumDiscountAmount": 5, "validityPeriod": 48}}
    st, js = cli.call("ma", "template/create", "POST", "/coupon-template/create", body, MERCHANT)
    d = data_of(js)
    if st != 200 or not d:
        raise RuntimeError("template create: %s %s" % (st, js))
    return d["id"]


def merchant(cli, state, stop, rate):
    """Templates: a fresh claim template every 30 s, find and page in between."""
    last_create = time.monotonic()
    n = 0
    for _ in paced(rate, stop):
        if time.monotonic() - last_create >= 30:
            last_create = time.monotonic()
            n += 1
            try:
                tid = create_template(cli, "soak %d" % n, 1800, -86400)
            except RuntimeError:
                continue
            with state.lock:
                state.claim_templates.append(tid)
        elif random.random() < 0.7:
            cli.call("ma", "template/find", "GET", "/coupon-template/find", None, MERCHANT,
                     {"couponTemplateId": state.some_template()})
        else:
            cli.call("ma", "template/page", "GET", "/coupon-template/page", None, MERCHANT,
                     {"current": random.randint(1, 3), "size": 10})


def claims(cli, state, stop, rate):
    """Half synchronous claims (coupons for the payment thread), half MQ claims."""
    sync = False
    for _ in paced(rate, stop):
        sync = not sync
        user = state.user()
        hdr = {"X-User-Id": str(user)}
        body = {"source": 0, "shopNumber": SHOP, "couponTemplateId": state.claim_template()}
        if sync:
            st, js = cli.call("engine", "redeem", "POST", "/user-coupon/redeem", body, hdr)
            d = data_of(js)
            if st == 200 and d:
                state.holders.append((user, d["userCouponId"]))
        else:
            rid = "soak-%x" % random.getrandbits(64)
            body["requestId"] = rid
            st, _ = cli.call("engine", "redeem-mq", "POST", "/user-coupon/redeem-mq", body, hdr)
            if st == 202:
                state.mq_pending.append((time.monotonic(), user, rid))


def engine_reads(cli, state, stop, rate, stats):
    """Template queries, wallets, and the outcome of MQ claims a second after they were made."""
    for _ in paced(rate, stop):
        r = random.random()
        pending = None
        if r < 0.25:
            try:
                t, user, rid = state.mq_pending[0]
                if time.monotonic() - t >= 1:
                    pending = state.mq_pending.popleft()
            except IndexError:
                pass
        if pending:
            _, js = cli.call("engine", "redeem-result", "GET", "/user-coupon/redeem-result",
                             None, {"X-User-Id": str(pending[1])}, {"requestId": pending[2]})
            with stats.lock:
                stats.results[(data_of(js) or {}).get("status")] += 1
        elif r < 0.5:
            cli.call("engine", "wallet", "GET", "/user-coupon/list", None,
                     {"X-User-Id": str(state.user())})
        else:
            cli.call("engine", "template/query", "GET", "/coupon-template/query", None,
                     {"X-User-Id": str(state.user())},
                     {"shopNumber": SHOP, "couponTemplateId": state.some_template()})


def payments(cli, state, stop, rate):
    """Lock a claimed coupon for an order, pay, refund (one cycle in four: lock, cancel); the
    coupon is unused again afterwards and goes back to the pool."""
    steps = []
    held = None
    for _ in paced(rate, stop):
        if not steps:
            if held:
                state.holders.append(held)
                held = None
            try:
                held = state.holders.popleft()
            except IndexError:
                continue
            ids = {"couponId": held[1], "orderId": str(random.randrange(1, 1 << 62))}
            lock = dict(ids, orderAmount="20", payableAmount="15", shopNumber=SHOP,
                        goodsList=[{"goodsNumber": "g1", "goodsAmount": "20"}])
            steps = [("create-payment-record", lock)]
            if random.random() < 0.25:
                steps.append(("cancel-payment", ids))
            else:
                steps += [("process-payment", ids), ("process-refund", ids)]
        path, body = steps.pop(0)
        st, _ = cli.call("engine", path, "POST", "/user-coupon/" + path, body,
                         {"X-User-Id": str(held[0])})
        if st != 200:
            steps = []  # the coupon's state is unknown: leave it out
            held = None


def reminders(cli, state, stop, rate):
    """Create a reminder on a template that opens later, list, cancel it."""
    steps = []
    for _ in paced(rate, stop):
        if not steps:
            user = state.user()
            body = {"couponTemplateId": state.remind_template, "shopNumber": SHOP,
                    "type": random.randint(0, 1), "remindTime": 5 * random.randint(1, 12)}
            steps = ["create", "list", "cancel"]
        step = steps.pop(0)
        hdr = {"X-User-Id": str(user)}
        if step == "list":
            cli.call("engine", "remind/list", "GET", "/coupon-template-remind/list", None, hdr)
        else:
            st, _ = cli.call("engine", "remind/" + step, "POST",
                             "/coupon-template-remind/" + step, body, hdr)
            if st != 200:
                steps = []


def settlement(cli, state, stop, rate):
    for _ in paced(rate, stop):
        amount = random.choice(["20", "100", "250.50"])
        cli.call("settlement", "coupon-query", "POST", "/coupon-query",
                 {"orderAmount": amount, "shopNumber": SHOP,
                  "goodsList": [{"goodsNumber": "g1", "goodsAmount": amount}]},
                 {"X-User-Id": str(state.user())})


def distribution(cli, state, stop, files, stats):
    """A 200-row sheet every 30 s (a bad id and a duplicate among them), polled to its end."""
    n = 0
    while not stop.is_set():
        n += 1
        name = "soak-%d.csv" % n
        users = random.sample(state.users, 198)
        with open("%s/%s" % (files, name), "w") as f:
            f.write("userId\n" + "".join("%d\n" % u for u in users) + "abc\n%d\n" % users[0])
        started = time.monotonic()
        st, js = cli.call("ma", "task/create", "POST", "/coupon-task/create",
                          {"taskName": "soak %d" % n, "fileAddress": name, "notifyType": "0",
                           "couponTemplateId": state.claim_template(), "sendType": 0},
                          MERCHANT)
        task = (data_of(js) or {}).get("id") if st == 200 else None
        status = None
        while task and not stop.wait(1):
            st, js = cli.call("ma", "task/find", "GET", "/coupon-task/find", None, MERCHANT,
                              {"taskId": task})
            status = (data_of(js) or {}).get("status")
            if status in (2, 3, 4):
                break
        if task and status is not None and status not in (0, 1):
            with stats.lock:
                stats.tasks["ok" if status == 3 else "failed"] += 1
        stop.wait(max(0, 30 - (time.monotonic() - started)))


def exchange(cli, state, stop, stats):
    """A batch of 20 exchange codes a minute; its codes redeemed one a second."""
    batch, last_batch = None, 0.0
    for _ in paced(1, stop):
        now = time.monotonic()
        if batch is None and now - last_batch >= 60:
            last_batch = now
            st, js = cli.call("ma", "code/create", "POST", "/coupon-template/exchange-code/create",
                              {"couponTemplateId": state.exchange_template, "count": 20},
                              MERCHANT)
            batch = (data_of(js) or {}).get("batchId") if st == 200 else None
        elif batch is not None:
            st, js = cli.call("ma", "code/find", "GET", "/coupon-template/exchange-code/find",
                              None, MERCHANT, {"batchId": batch})
            status = (data_of(js) or {}).get("status")
            if status == 1:
                st, raw = cli.call("ma", "code/export", "GET",
                                   "/coupon-template/exchange-code/export", None, MERCHANT,
                                   {"batchId": batch})
                if st == 200 and isinstance(raw, bytes):
                    with zipfile.ZipFile(io.BytesIO(raw)) as z:
                        for name in z.namelist():
                            for code in CODE_RE.findall(z.read(name)):
                                state.codes.append(code.decode())
                batch = None
            elif status != 0:
                batch = None
        elif state.codes:
            cli.call("engine", "exchange", "POST", "/user-coupon/exchange",
                     {"code": state.codes.popleft()}, {"X-User-Id": str(state.user())})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ma", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--settlement", required=True)
    ap.add_argument("--files", required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    def split(url, prefix):
        u = urllib.parse.urlsplit(url)
        return u.hostname, u.port, prefix

    urls = {"ma": split(a.ma, "/api/merchant-admin"), "engine": split(a.engine, "/api/engine"),
            "settlement": split(a.settlement, "/api/settlement")}
    stats, state, stop = Stats(), State(), threading.Event()
    setup = Client(stats, urls)
    state.claim_templates.append(create_template(setup, "soak 0", 1800, -86400))
    state.remind_template = create_template(setup, "soak remind", 1000, 3 * 3600)
    state.exchange_template = create_template(setup, "soak exchange", 100000, -86400)

    s = a.scale
    jobs = [(merchant, (s * 15,)), (claims, (s * 60,)), (engine_reads, (s * 120, stats)),
            (payments, (s * 12,)), (reminders, (s * 6,)), (settlement, (s * 50,)),
            (distribution, (a.files, stats)), (exchange, (stats,))]
    threads = [threading.Thread(target=f, args=(Client(stats, urls), state, stop) + args,
                                daemon=True) for f, args in jobs]
    for t in threads:
        t.start()
    stop.wait(a.seconds)
    stop.set()
    for t in threads:
        t.join(60)

    names = {"ma": "merchant-admin", "engine": "engine", "settlement": "settlement"}
    total = sum(sum(c.values()) for c in stats.by_class.values())
    print("requests in %.0f s: %d (%.0f/s)" % (a.seconds, total, total / a.seconds))
    print("%-16s %9s %9s %9s %9s" % ("service", "2xx", "4xx", "5xx", "no answer"))
    with open(a.out, "w") as out:
        for svc in ("ma", "engine", "settlement"):
            c = stats.by_class[svc]
            print("%-16s %9d %9d %9d %9d" % (names[svc], c["2xx"], c["4xx"], c["5xx"], c["err"]))
            out.write("%s %d %d %d %d\n" % (names[svc], c["2xx"], c["4xx"], c["5xx"], c["err"]))
        out.write("tasks %d %d\n" % (stats.tasks["ok"], stats.tasks["failed"]))
    print("distribution tasks: %d succeeded, %d did not" % (stats.tasks["ok"],
                                                             stats.tasks["failed"]))
    print("requests by route:", ", ".join("%s %s %d" % (names[svc], route, n) for (svc, route), n
                                          in sorted(stats.routes.items())))
    print("MQ claim results a second or more after acceptance:",
          ", ".join("%s %d" % kv for kv in sorted(stats.results.items(), key=str)))
    if stats.non2xx:
        print("non-2xx answers (service, route, status, code: count):")
        for (svc, route, status, code), n in stats.non2xx.most_common(12):
            print("  %s %s %s %s: %d" % (names[svc], route, status, code, n))
    for sample in stats.samples_5xx:
        print("  5xx or no answer: %s %s %s %s" % sample)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
