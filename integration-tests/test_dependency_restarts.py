"""The four services ride out restarts of their stores. PostgreSQL, Redis and RabbitMQ of a private
infrastructure (deploy/local/infra.sh in a directory of this suite's own, so that killing them
disturbs no other suite) are killed (-9) one after the other under the running services. While
one is down: no service exits, every /readyz that depends on it answers 503 within a few seconds,
/livez still answers, and every representative request answers at once (under 2 s, against a
request timeout of 10 s): those that need the dead store with a retryable 503 C000001 in a JSON
body, the others as usual. Once it is started again on the same port, every /readyz is 200 within
30 s without a restart of any service, the same requests succeed, claims accepted (202) just
before the kill and during the outage end SUCCESS, a template created after is claimable, a
distribution task posted after runs to its end, and no message was dead-lettered by the outage:
a template.ended event consumed while Redis was down waits uncounted instead of using up its
attempts. The Redis outage outlasts the snowflake worker-id lease (shortened here), so the
services must lease a new worker id by themselves."""

import os
import random
import shutil
import signal
import subprocess
import tempfile
import time

from quan import (BIN, SERVICES, TMP, Service, check, infra_env, infra_sh, parallel, private_stack,
                  request, run, wait_for)

MA = "/api/merchant-admin/"
EN = "/api/engine/"
FAST_S = 2.0          # longest answer while a store is down (the request timeout is 10 s)
READY_DOWN_S = 5.0    # /readyz turns 503 within this after the kill
READY_UP_S = 30.0     # and 200 within this after the store is back
BURST = 64           # concurrent requests while a store is down: none waits in a queue
LEASE_MS = 6000       # the snowflake worker-id lease (QUAN_IDS_LEASE_MS), short enough to lose
# Every consumer of the services: none may have dead-lettered anything.
CONSUMERS = ["engine.redeem", "engine.coupon-expire", "engine.payment-timeout", "engine.remind",
             "merchant-admin.code-generate", "merchant-admin.task-schedule",
             "merchant-admin.task-count", "merchant-admin.template-ended",
             "distribution.task-execute", "distribution.task-notify"]
# Which services need which store (/readyz answers 503 while it is down).
NEEDS = {"postgres": set(SERVICES), "redis": set(SERVICES),
         "rabbitmq": {"merchant-admin", "engine", "distribution"}}

DIR = None   # the infrastructure's directory
svc = {}     # name -> Service
pids = {}    # name -> the pid it had at start: never restarted
shop = 0


# ---------------------------------------------------------------- the infrastructure

# Durable: a killed Redis keeps what it acknowledged (its AOF fsynced on every write).
DURABLE = {"QUAN_INFRA_DURABILITY": "durable", "QUAN_INFRA_REDIS_APPENDFSYNC": "always"}


def infra(cmd):
    return infra_sh(DIR, cmd, DURABLE)


def recorded_pid(name):
    pid = None
    with open(os.path.join(DIR, "pids")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                pid = int(parts[1])
    check(pid, "no %s in %s/pids" % (name, DIR))
    return pid


def alive(pid):
    """pid exists and is not a zombie (PID 1 here may not reap)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid):
    kids = {}
    for line in subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True,
                               text=True).stdout.splitlines():
        p, pp = map(int, line.split())
        kids.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def kill(store):
    """kill -9 of the store: Redis' server, PostgreSQL's postmaster, RabbitMQ's whole node (the
    wrapper script, beam.smp and its helpers; its epmd stays)."""
    if store == "rabbitmq":
        victims = descendants(recorded_pid("rabbitmq"))
    else:
        victims = [recorded_pid(store)]
    for p in victims:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    check(wait_for(lambda: not any(alive(p) for p in victims), 10),
          "%s did not die: %s" % (store, [p for p in victims if alive(p)]))


def restart():
    """infra.sh start restarts what is down on the same ports. PostgreSQL refuses to start while
    backends of the killed postmaster still hold its shared memory; they leave within seconds."""
    before = infra_env(DIR)
    for attempt in range(5):
        try:
            infra("start")
            break
        except AssertionError:
            if attempt == 4:
                raise
            time.sleep(1)
    after = infra_env(DIR)
    for k in ("QUAN_INFRA_REDIS_PORT", "QUAN_INFRA_PG_PORT", "QUAN_INFRA_AMQP_PORT"):
        check(before[k] == after[k], "%s moved: %s -> %s" % (k, before[k], after[k]))


# ---------------------------------------------------------------- requests

def merchant():
    return {"X-User-Id": "1", "X-Shop-Number": str(shop)}


def user_hdr(user):
    return {"X-User-Id": str(user)}


def new_user():
    return random.randint(10 ** 12, 9 * 10 ** 15)


def fmt_time(t):
    """RFC 3339 in UTC (the API's plain times are in QUAN_TIMEZONE)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))


def template_body(stock=100, end=None):
    return {"name": "rideout-%x" % random.getrandbits(40), "source": 0, "target": 1, "type": 0,
            "validStartTime": fmt_time(time.time() - 86400),
            "validEndTime": fmt_time(end or time.time() + 30 * 86400), "stock": stock,
            "receiveRule": {"limitPerPerson": 1},
            "consumeRule": {"termsOfUse": 0, "maximumDiscountAmount": 5, "validityPeriod": 48}}


def timed(name, method, url, body=None, headers=None):
    """(status, body, seconds): the answer must come (no reset, no hang)."""
    t = time.time()
    try:
        st, _, r = request(method, url, body, headers, timeout=15)
    except OSError as e:
        raise AssertionError("%s: no answer after %.2f s: %r" % (name, time.time() - t, e))
    return st, r, time.time() - t


def create_template(stock=100, end=None):
    st, r, _ = timed("template create", "POST", svc["merchant-admin"].url + MA +
                     "coupon-template/create", template_body(stock, end), merchant())
    check(st == 200, "template create: %s %s" % (st, r))
    return r["data"]["id"]


def claim(tpl, user, mq=False):
    body = {"source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl)}
    path = "user-coupon/redeem-mq" if mq else "user-coupon/redeem"
    return timed("claim", "POST", svc["engine"].url + EN + path, body, user_hdr(user))


def claim_mq_accepted(tpl):
    user = new_user()
    st, r, _ = claim(tpl, user, mq=True)
    check(st == 202, "redeem-mq: %s %s" % (st, r))
    return user, r["data"]["requestId"]


def claim_result(user, rid):
    st, r, _ = timed("redeem-result", "GET", svc["engine"].url + EN +
                     "user-coupon/redeem-result?requestId=" + rid, None, user_hdr(user))
    return st, r


def check_settled(claims, timeout=30):
    """Each (user, request id) reads SUCCESS at /redeem-result in time."""
    for user, rid in claims:
        last = []

        def done():
            st, r = claim_result(user, rid)
            last[:] = [st, r]
            return st == 200 and r["data"]["status"] == "SUCCESS"
        check(wait_for(done, timeout), "claim %s of %s did not settle: %s" % (rid, user, last))


def requests_of(tpl):
    """The representative requests: (name, store it needs, method, url, body, headers). A fresh
    user per call, so that no per-user limit interferes."""
    en, ma, se = svc["engine"].url, svc["merchant-admin"].url, svc["settlement"].url
    claim_body = {"source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl)}
    return [
        ("engine claim", {"postgres", "redis"}, "POST", en + EN + "user-coupon/redeem",
         claim_body, user_hdr(new_user())),
        ("engine claim via MQ", {"redis", "rabbitmq"}, "POST", en + EN + "user-coupon/redeem-mq",
         claim_body, user_hdr(new_user())),
        ("engine wallet", {"postgres"}, "GET", en + EN + "user-coupon/list", None,
         user_hdr(new_user())),
        ("engine template query", {"redis"}, "GET", en + EN + "coupon-template/query?shopNumber=%s"
         "&couponTemplateId=%s" % (shop, tpl), None, user_hdr(new_user())),
        ("merchant-admin template create", {"postgres", "redis"}, "POST", ma + MA +
         "coupon-template/create", template_body(), merchant()),
        ("merchant-admin template find", {"postgres"}, "GET", ma + MA +
         "coupon-template/find?couponTemplateId=%s" % tpl, None, merchant()),
        ("merchant-admin task page", {"postgres"}, "GET", ma + MA + "coupon-task/page", None,
         merchant()),
        ("settlement coupon query", {"postgres"}, "POST", se + "/api/settlement/coupon-query",
         {"orderAmount": 150, "shopNumber": str(shop), "goodsList": []},
         user_hdr(new_user())),
    ]


def probe(tpl, down):
    """Every representative request answers within FAST_S: 503 C000001 with a JSON body when it
    needs the store that is down (down: None when all are up), else 2xx. Returns the
    (user, request id) of claims accepted on the way."""
    accepted = []
    for name, needs, method, url, body, headers in requests_of(tpl):
        st, r, took = timed(name, method, url, body, headers)
        what = "%s with %s down: %s in %.2f s: %s" % (name, down, st, took, r)
        check(took < FAST_S, "slow: " + what)
        check(isinstance(r, dict) and "code" in r, "not a JSON envelope: " + what)
        if down in needs:
            check(st == 503 and r["code"] == "C000001", "not a retryable 503: " + what)
        else:
            check(st in (200, 202) and r["code"] == "0", "failed: " + what)
            if st == 202:
                accepted.append((int(headers["X-User-Id"]), r["data"]["requestId"]))
    return accepted


def burst(tpl, down):
    """BURST requests at once, each of the representative ones in turn: every answer within
    FAST_S (nothing queues behind a connection attempt), those that need the dead store 503."""
    reqs = []
    while len(reqs) < BURST:  # fresh users each round: one user's claims race each other
        reqs += [r for r in requests_of(tpl) if r[0] != "merchant-admin template create"]
    got = parallel(lambda r: (r[0], r[1]) + timed(*r[:1] + r[2:]), reqs)
    slow = [(n, st, round(t, 2)) for n, _, st, _, t in got if t >= FAST_S]
    check(not slow, "slow answers in a burst with %s down: %s" % (down, slow))
    wrong = [(n, st, r) for n, needs, st, r, _ in got if down in needs and st != 503]
    check(not wrong, "not 503 in a burst with %s down: %s" % (down, wrong[:3]))


def readyz(s):
    try:
        return request("GET", s.url + "/readyz", timeout=FAST_S)[0]
    except OSError:
        return None


def check_processes():
    for name, s in svc.items():
        check(s.proc.poll() is None, "%s exited (%s):\n%s" % (name, s.proc.returncode, s.tail()))
        check(s.proc.pid == pids[name], "%s was restarted" % name)
        st, _, r = request("GET", s.url + "/livez", timeout=FAST_S)
        check(st == 200, "%s /livez: %s %s" % (name, st, r))


def check_ready(timeout):
    t = time.time()
    ok = wait_for(lambda: all(readyz(s) == 200 for s in svc.values()), timeout)
    check(ok, "not ready %ss after the restart: %s\n%s" % (
        timeout, {n: readyz(s) for n, s in svc.items()},
        "\n".join(s.tail(8) for s in svc.values() if readyz(s) != 200)))
    return time.time() - t


def dead_letters():
    """Messages in the dead-letter queues of every consumer (quan-dlq list)."""
    out = {}
    for c in CONSUMERS:
        r = subprocess.run([os.path.join(BIN, "quan-dlq"), "list", c], capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 0, "quan-dlq list %s: %s" % (c, r.stderr))
        if r.stdout.strip():
            out[c] = r.stdout.strip().splitlines()
    return out


def run_task(tpl, users):
    """A distribution task of users (a CSV under QUAN_FILE_ROOT) for tpl, run to its end."""
    name = "users-%x.csv" % random.getrandbits(40)
    with open(os.path.join(DIR, "files", name), "w") as f:
        f.write("userId\n" + "".join("%d\n" % u for u in users))
    body = {"taskName": "rideout", "fileAddress": name, "notifyType": "0",
            "couponTemplateId": str(tpl), "sendType": 0}
    st, r, _ = timed("task create", "POST", svc["merchant-admin"].url + MA + "coupon-task/create",
                     body, merchant())
    check(st == 200, "task create: %s %s" % (st, r))
    task = r["data"]["id"]
    last = {}

    def ended():
        st, r, _ = timed("task find", "GET", svc["merchant-admin"].url + MA +
                         "coupon-task/find?taskId=%s" % task, None, merchant())
        last.update(r["data"] or {})
        return st == 200 and r["data"]["status"] in (2, 3, 4)
    check(wait_for(ended, 30), "task did not end: %s\n%s" % (last, svc["distribution"].tail(10)))
    check(last["status"] == 3 and last["successNum"] == len(users), "task: %s" % last)


# ---------------------------------------------------------------- the outages

def ride_out(store, outage_s=0.0, before_kill=None):
    """Kills store, checks the services while it is down (for at least outage_s), starts it
    again, checks they come back by themselves. before_kill() runs just before the kill."""
    tpl = create_template()
    probe(tpl, None)  # everything works, and the template is cached
    before = [claim_mq_accepted(tpl)]
    if before_kill:
        before_kill()
    kill(store)
    killed = time.time()
    try:
        # Down: alive, not ready (where it matters), fast answers.
        needs = NEEDS[store]
        check(wait_for(lambda: all(readyz(svc[n]) == 503 for n in needs), READY_DOWN_S),
              "/readyz with %s down: %s" % (store, {n: readyz(s) for n, s in svc.items()}))
        for n in set(svc) - needs:
            check(readyz(svc[n]) == 200, "%s does not need %s but is not ready" % (n, store))
        check_processes()
        during = probe(tpl, store)
        burst(tpl, store)
        time.sleep(max(0.0, outage_s - (time.time() - killed)))
        during += probe(tpl, store)  # still fast, whatever backoff the clients are in
        check_processes()
    finally:
        restart()  # the next outage starts from a whole infrastructure, whatever happened

    # Back: ready in time, without a restart of ours.
    took = check_ready(READY_UP_S)
    print("  %s: down %.1f s, all ready %.1f s after its restart" % (
        store, time.time() - killed - took, took))
    check_processes()
    after = probe(tpl, None)
    # Consumers resumed: claims accepted before, during and after all settle.
    after.append(claim_mq_accepted(tpl))
    check_settled(before + during + after)
    # A template created now is claimable, at once and through the queue, and distributable.
    fresh = create_template()
    st, r, _ = claim(fresh, new_user())
    check(st == 200, "claim of a template created after: %s %s" % (st, r))
    check_settled([claim_mq_accepted(fresh)])
    run_task(fresh, [new_user() for _ in range(3)])
    check(not dead_letters(), "dead letters after the %s outage: %s" % (store, dead_letters()))
    check_processes()


def test_postgres_restart():
    ride_out("postgres")


def test_redis_restart():
    """Longer than the worker-id lease: the lease is lost and leased again. A template.ended
    event falls due while Redis is down: its consumer cannot update the cache, and it waits
    uncounted until Redis is back instead of being dead-lettered after QUAN_MQ_MAX_ATTEMPTS."""
    ending = []

    def end_soon():
        ending.append(create_template(end=time.time() + 3))
    ride_out("redis", outage_s=LEASE_MS / 1000.0 + 3, before_kill=end_soon)
    st, r, _ = timed("find", "GET", svc["merchant-admin"].url + MA +
                     "coupon-template/find?couponTemplateId=%s" % ending[0], None, merchant())
    check(st == 200 and r["data"]["status"] == 1, "the template did not end: %s %s" % (st, r))


def test_rabbitmq_restart():
    ride_out("rabbitmq")


def main():
    global DIR, shop
    DIR = tempfile.mkdtemp(prefix="rideout-", dir=TMP)
    os.chmod(DIR, 0o755)  # PostgreSQL runs as user postgres when we are root
    os.makedirs(os.path.join(DIR, "files"))
    shop = random.randint(10 ** 12, 9 * 10 ** 12)
    try:
        private_stack(DIR, DURABLE)
        env = {"QUAN_MQ_RETRY_DELAY_MS": "300", "QUAN_MQ_MAX_ATTEMPTS": "3",
               "QUAN_IDS_LEASE_MS": str(LEASE_MS), "QUAN_FILE_ROOT": os.path.join(DIR, "files"),
               "QUAN_LOG_LEVEL": "info"}
        for name in SERVICES:
            svc[name] = Service(name, env)
        for s in svc.values():
            s.wait_ready()
            pids[s.name] = s.proc.pid
        run([test_postgres_restart, test_redis_restart, test_rabbitmq_restart])
    finally:
        for s in svc.values():
            s.stop()
        try:
            infra("stop")
        finally:
            shutil.rmtree(DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
