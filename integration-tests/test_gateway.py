"""The API gateway (deploy/gateway/, run by deploy/local/gateway.sh) in front of real services:
two engine replicas, a merchant-admin and a settlement, on free ports. Tokens come from
quan-token, or are forged here with hmac. Checked:
  - routes: /api/engine/, /api/merchant-admin/, /api/settlement/ reach their service; every
    other path (probes, /metrics, /debug, distribution) is nginx's 404, in the envelope;
  - 401 in the services' envelope (fields in their order) for a missing, malformed, badly
    signed, expired, not yet valid, alg none / HS512 token and bad claims (a name with CR LF);
  - identity from the token only: a forged X-User-Id (any case) is replaced, a forged
    X-Shop-Number or X-Username without the claim is removed (the service's missing-shop 401);
    the services act as the token's user and shop, and log its name;
  - X-Request-Id and traceparent pass unchanged; nginx's own answers carry a request id;
  - bodies over 1 MiB: 413 from nginx; exactly 1 MiB reaches the service;
  - one engine killed (-9): every GET still 200, every POST goes to the other one once (the
    connection was refused); a replica that dies holding a POST it received: 502, the POST not
    sent again (the user has no coupon); a GET in the same spot is sent again (200);
  - rate limits (gateways of their own, small limits set by QUAN_GATEWAY_RATE_* and
    QUAN_GATEWAY_CONN_ADDR; clients told apart by source address within 127.0.0.0/8): one
    user's burst is refused 429 (Retry-After: 1, the envelope, A000429) while another user is
    served; many users behind one address are refused while another address is served, and
    requests without a token spend their address's budget too; merchant routes have a zone of
    their own; the console's files are not limited by the API's budget but by theirs; requests
    in flight per address; every refusal is a REJECTED line of the access log, and only those;
    a flash sale of 200 shoppers (some behind a NAT) under the default limits is refused
    nothing; the defaults are deploy/gateway/k8s/limits.conf;
  - /metrics on the gateway's metrics port (QUAN_GATEWAY_METRICS_PORT) only: bursts past one
    limit each raise that limit's counter by the 429s seen and no other (the connection limit's
    in its own test), the gateway's 401s counted and a service's not;
  - the cache of verified tokens: a token's later requests are hits (forged identity headers
    still replaced), a token is refused once past its exp though it was cached, another
    signature of the same header and payload is not the cached token, a refused token is never
    cached;
  - gateway.sh: status, start twice, stop twice, refused configurations; the key given as a
    file (QUAN_GATEWAY_JWT_SECRET_FILE), which the workers read for each request: tokens of it
    pass, of another key not, a key written over it is used without a restart (and a token of
    the old key, cached before, is refused within a second), and none is in nginx's environment.
The last line is "N passed, N failed"."""

import base64
import hashlib
import hmac
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from quan import BIN, ROOT, TMP, Service, check, free_port, request, run, wait_for

GATEWAY_SH = os.path.join(ROOT, "deploy", "local", "gateway.sh")
TOKEN = os.path.join(BIN, "quan-token")
KEY = "gw-test-key-%016x" % random.getrandbits(64)
SHOP = random.randint(10**12, 9 * 10**12)
MERCHANT = random.randint(10**6, 10**7)

ma = en1 = en2 = st = None
gw = None  # the main gateway: {"dir", "url", "port"}
gateways = []
tpl_id = None


def new_user():
    return random.randint(10**10, 9 * 10**13)


# ---------------------------------------------------------------- gateways and tokens


# The rate limits off: the tests of routes, tokens and replicas send as fast as they can, most
# as one user. The limits' own tests set theirs.
LIMITS_OFF = {v: "off" for v in ("QUAN_GATEWAY_RATE_USER", "QUAN_GATEWAY_RATE_MERCHANT",
                                 "QUAN_GATEWAY_RATE_ADDR", "QUAN_GATEWAY_RATE_CONSOLE",
                                 "QUAN_GATEWAY_CONN_ADDR")}


def start_gateway(engines, name, limits=None):
    """gateway.sh start in a fresh directory, with the rate limits given (none: off; {}: the
    defaults); the gateway as a dict."""
    d = tempfile.mkdtemp(prefix="gateway-%s." % name, dir=TMP)
    port, mport = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in LIMITS_OFF}
    env.update(LIMITS_OFF if limits is None else limits)
    env.update({"QUAN_GATEWAY_PORT": str(port), "QUAN_GATEWAY_METRICS_PORT": str(mport),
                "QUAN_GATEWAY_JWT_SECRET": KEY,
                "QUAN_GATEWAY_ENGINE": ",".join("127.0.0.1:%d" % e.port for e in engines),
                "QUAN_GATEWAY_MERCHANT_ADMIN": "127.0.0.1:%d" % ma.port,
                "QUAN_GATEWAY_SETTLEMENT": "127.0.0.1:%d" % st.port})
    r = subprocess.run(["bash", GATEWAY_SH, "start", d], env=env, capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, "gateway.sh start: %s %s" % (r.returncode, r.stderr))
    g = {"dir": d, "port": port, "url": "http://127.0.0.1:%d" % port, "env": env,
         "metrics": "http://127.0.0.1:%d/metrics" % mport}
    gateways.append(g)
    return g


def metrics(g):
    """The gateway's /metrics as {"name{labels}": value}, its format checked on the way."""
    s, h, body = request("GET", g["metrics"], None, None, timeout=10)
    check(s == 200 and h.get("Content-Type", "").startswith("text/plain; version=0.0.4"),
          "/metrics: %s %s" % (s, h))
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def refusals(m, limit):
    return m['quan_gateway_rate_limited_total{limit="%s"}' % limit]


def answered(g):
    """Requests g has counted as answered: a request is counted, and its token cached, when it
    is done with (its log phase), a moment after its answer for a client that closes."""
    return sum(v for k, v in metrics(g).items() if k.startswith("quan_gateway_requests_total"))


def wait_done(g, n):
    """Until g has counted n requests answered."""
    check(wait_for(lambda: answered(g) >= n, 5), "%s: %d requests done" % (g["url"], n))


def stop_gateway(g):
    subprocess.run(["bash", GATEWAY_SH, "stop", g["dir"]], capture_output=True, timeout=60)


def mint(*args, key=KEY):
    env = dict(os.environ, QUAN_GATEWAY_JWT_SECRET=key)
    r = subprocess.run([TOKEN] + [str(a) for a in args], env=env, capture_output=True,
                       text=True, timeout=10)
    check(r.returncode == 0, "quan-token %s: %s %s" % (args, r.returncode, r.stderr))
    return r.stdout.strip()


def b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def forge(header, payload, key=KEY):
    """A token of any header and payload, signed under key."""
    h = b64(json.dumps(header, separators=(",", ":")).encode())
    p = b64(json.dumps(payload, separators=(",", ":")).encode())
    sig = hmac.new(key.encode(), ("%s.%s" % (h, p)).encode(), hashlib.sha256).digest()
    return "%s.%s.%s" % (h, p, b64(sig))


def bearer(token, extra=None):
    h = {"Authorization": "Bearer " + token}
    h.update(extra or {})
    return h


def user_token(user):
    return mint("--user", user)


def call(method, path, body=None, headers=None, g=None, timeout=10):
    return request(method, (g or gw)["url"] + path, body, headers, timeout=timeout)


def redeem_body():
    return {"source": 0, "shopNumber": str(SHOP), "couponTemplateId": str(tpl_id)}


def wallet_direct(svc, user):
    """The user's coupons of tpl_id, asked of an engine directly (not through the gateway)."""
    s, _, r = request("GET", svc.url + "/api/engine/user-coupon/list", None,
                      {"X-User-Id": str(user)})
    check(s == 200, "wallet of %s: %s %s" % (user, s, r))
    return [c for c in r["data"] if c["couponTemplateId"] == str(tpl_id)]


def raw_http(port, data, timeout=10):
    """Sends data on a new connection, returns the status line and the rest."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # nginx may answer and close before the whole body is sent
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    return out


def is_envelope(r, code):
    return (isinstance(r, dict) and list(r) == ["code", "message", "data", "requestId", "success"]
            and r["code"] == code and r["data"] is None and r["success"] is False
            and isinstance(r["requestId"], str) and r["requestId"])


# ---------------------------------------------------------------- setup


def test_setup():
    global ma, en1, en2, st, gw, tpl_id
    ma = Service("merchant-admin", replicas=1)
    en1 = Service("engine", replicas=1)
    en2 = Service("engine", replicas=1)
    st = Service("settlement", replicas=1)
    for s in (ma, en1, en2, st):
        s.wait_ready()
    gw = start_gateway([en1, en2], "main")
    # A template of the merchant's shop, created through the gateway with a merchant's token.
    tok = mint("--user", MERCHANT, "--shop", SHOP, "--name", "alice")
    s, _, r = call("POST", "/api/merchant-admin/coupon-template/create",
                   {"name": "gw-%x" % random.getrandbits(32), "source": 0, "target": 1,
                    "type": 0, "validStartTime": "2025-01-01 00:00:00",
                    "validEndTime": "2035-01-01 00:00:00", "stock": 10000,
                    "receiveRule": {"limitPerPerson": 1, "usageInstructions": "t"},
                    "consumeRule": {"maximumDiscountAmount": 5, "validityPeriod": 48}},
                   bearer(tok, {"X-Shop-Number": "1", "X-Username": "mallory"}))
    check(s == 200, "create through the gateway: %s %s" % (s, r))
    tpl_id = int(r["data"]["id"])


# ---------------------------------------------------------------- routes


def test_unknown_paths_are_404():
    tok = user_token(new_user())
    for path in ("/", "/livez", "/readyz", "/metrics", "/debug/sleep?ms=1",
                 "/api/distribution/x", "/api/engine", "/api/other/x", "/engine/user-coupon/list"):
        for h in ({}, bearer(tok)):
            s, rh, r = call("GET", path, None, h)
            check(s == 404 and is_envelope(r, "A000404"), "%s: %s %s" % (path, s, r))
            check(rh.get("X-Request-Id") == r["requestId"], "%s: request id %s" % (path, rh))
            check(rh.get("Content-Type") == "application/json", "%s: %s" % (path, rh))


def test_routes_reach_their_service():
    user = new_user()
    tok = user_token(user)
    s, _, r = call("GET", "/api/engine/user-coupon/list", None, bearer(tok))
    check(s == 200 and r["data"] == [], "engine: %s %s" % (s, r))
    s, _, r = call("POST", "/api/settlement/coupon-query",
                   {"orderAmount": 150, "shopNumber": str(SHOP), "goodsList": []}, bearer(tok))
    check(s == 200 and "availableCouponList" in r["data"], "settlement: %s %s" % (s, r))
    s, _, r = call("GET", "/api/merchant-admin/coupon-template/find?couponTemplateId=%d" % tpl_id,
                   None, bearer(mint("--user", MERCHANT, "--shop", SHOP)))
    check(s == 200 and r["data"]["id"] == str(tpl_id), "merchant-admin: %s %s" % (s, r))
    # A path that is not a route of the service, under its prefix: the service's own 404.
    s, _, r = call("GET", "/api/engine/no-such-route", None, bearer(tok))
    check(s == 404 and "no such path: /api/engine/no-such-route" in r["message"], "%s %s" % (s, r))


# ---------------------------------------------------------------- refused tokens


def refused(headers, want, code=401):
    s, rh, r = call("GET", "/api/engine/user-coupon/list", None, headers)
    check(s == code and is_envelope(r, "A000401"), "%s: %s %s" % (want, s, r))
    check(want in r["message"], "message %r, wanted %r" % (r["message"], want))
    check(rh.get("X-Request-Id") == r["requestId"], "request id header %s" % rh)
    check(rh.get("WWW-Authenticate", "").startswith("Bearer"), "WWW-Authenticate %s" % rh)
    return r


def test_401_missing_token():
    refused({}, "missing token")
    # The forged headers alone do not make a caller.
    refused({"X-User-Id": "42", "X-Shop-Number": "7"}, "missing token")
    refused({"Authorization": ""}, "missing token")


def test_401_malformed():
    user = new_user()
    good = user_token(user)
    refused({"Authorization": "Basic dXNlcjpwYXNz"}, "malformed token")
    refused({"Authorization": "Bearer"}, "malformed token")
    refused({"Authorization": "Bearer abc"}, "malformed token: not three base64url parts")
    refused({"Authorization": "Bearer a.b"}, "malformed token: not three base64url parts")
    refused({"Authorization": "Bearer " + good + ".x"}, "not three base64url parts")
    refused({"Authorization": "Bearer a+b.c.d"}, "not three base64url parts")
    refused({"Authorization": "Bearer bm90IGpzb24.e30.x"}, "the header must be a JSON object")
    refused({"Authorization": "Bearer " + "a" * 5000 + ".b.c"}, "malformed token")


def test_401_bad_signature():
    user = new_user()
    refused(bearer(mint("--user", user, key="another-key-0123456789")), "bad token signature")
    good = user_token(user)
    h, p, sig = good.split(".")
    # The payload of another user under the first one's signature.
    other = json.loads(base64.urlsafe_b64decode(p + "=="))
    other["sub"] = str(user + 1)
    p2 = b64(json.dumps(other, separators=(",", ":")).encode())
    refused(bearer("%s.%s.%s" % (h, p2, sig)), "bad token signature")
    refused(bearer("%s.%s.%s" % (h, p, sig[:-1] + ("A" if sig[-1] != "A" else "B"))),
            "bad token signature")
    # A key that differs in its last character only.
    refused(bearer(forge({"alg": "HS256"}, {"sub": str(user), "exp": time.time() + 60},
                         key=KEY[:-1] + ("x" if KEY[-1] != "x" else "y"))), "bad token signature")


def test_401_expired_and_not_yet_valid():
    user = str(new_user())
    now = int(time.time())
    refused(bearer(forge({"alg": "HS256", "typ": "JWT"}, {"sub": user, "exp": now - 3600})),
            "token expired")
    refused(bearer(forge({"alg": "HS256"}, {"sub": user, "exp": now - 1})), "token expired")
    refused(bearer(forge({"alg": "HS256"}, {"sub": user, "exp": now + 600, "nbf": now + 300})),
            "token not valid yet")
    refused(bearer(forge({"alg": "HS256"}, {"sub": user})), "exp must be a number")
    refused(bearer(forge({"alg": "HS256"}, {"sub": user, "exp": str(now + 60)})),
            "exp must be a number")
    # nbf passed: good.
    s, _, r = call("GET", "/api/engine/user-coupon/list", None,
                   bearer(forge({"alg": "HS256"}, {"sub": user, "exp": now + 60,
                                                   "nbf": now - 60})))
    check(s == 200, "nbf passed: %s %s" % (s, r))


def test_401_alg():
    user = str(new_user())
    exp = int(time.time()) + 600
    payload = b64(json.dumps({"sub": user, "exp": exp}).encode())
    # alg none, no signature (the classic), and none with some signature.
    for tok in ("%s.%s." % (b64(b'{"alg":"none","typ":"JWT"}'), payload),
                "%s.%s.AAAA" % (b64(b'{"alg":"none"}'), payload)):
        refused(bearer(tok), "")  # either "not three parts" or the header's rule
    header_rule = "the header must be a JSON object with alg HS256, no crit, typ JWT if any"
    refused(bearer(forge({"alg": "none"}, {"sub": user, "exp": exp})), header_rule)
    refused(bearer(forge({"alg": "HS512"}, {"sub": user, "exp": exp})), header_rule)
    refused(bearer(forge({"alg": "hs256"}, {"sub": user, "exp": exp})), header_rule)
    refused(bearer(forge({"typ": "JWT"}, {"sub": user, "exp": exp})), header_rule)
    refused(bearer(forge({"alg": "HS256", "crit": ["exp"]}, {"sub": user, "exp": exp})),
            header_rule)
    refused(bearer(forge({"alg": "HS256", "typ": "JWS"}, {"sub": user, "exp": exp})), header_rule)
    # typ JWT in any case, or not a string: good.
    for typ in ("jwt", 5):
        s, _, r = call("GET", "/api/engine/user-coupon/list", None,
                       bearer(forge({"alg": "HS256", "typ": typ}, {"sub": user, "exp": exp})))
        check(s == 200, "typ %r: %s %s" % (typ, s, r))
    # The payload is read before the signature is checked (the same order as quan-token's).
    refused(bearer("%s.%s.%s" % (b64(b'{"alg":"HS256"}'), b64(b"not json"), "A" * 43)),
            "the payload is not a JSON object")


def test_401_bad_claims():
    exp = int(time.time()) + 600
    for sub in (None, 42, "0", "-5", "042", "12a", "9223372036854775808"):
        payload = {"exp": exp}
        if sub is not None:
            payload["sub"] = sub
        refused(bearer(forge({"alg": "HS256"}, payload)), "sub must be a positive decimal user id")
    refused(bearer(forge({"alg": "HS256"}, {"sub": "1", "shop": 5, "exp": exp})),
            "shop must be a positive decimal shop number")
    # A name that would split the header it becomes.
    for name in ("eve\r\nX-User-Id: 1", "eve\nx", "tab\tname", "", "n" * 65, 7):
        refused(bearer(forge({"alg": "HS256"}, {"sub": "1", "name": name, "exp": exp})),
                "name must be 1 to 64 characters")


def test_401_keeps_the_request_id():
    r = refused({"X-Request-Id": "gw-401-check.1"}, "missing token")
    check(r["requestId"] == "gw-401-check.1", "client request id: %s" % r)
    # One the services would not keep: nginx's own, 32 hex digits.
    r = refused({"X-Request-Id": "bad!id"}, "missing token")
    check(len(r["requestId"]) == 32 and all(c in "0123456789abcdef" for c in r["requestId"]),
          "generated request id: %s" % r)


# ---------------------------------------------------------------- identity


def test_identity_comes_from_the_token():
    a, b = new_user(), new_user()
    tok = user_token(a)
    hits = metrics(gw)['quan_gateway_token_cache_total{result="hit"}']
    done = answered(gw)
    # A forged X-User-Id in three spellings beside a token for a.
    s, _, r = call("POST", "/api/engine/user-coupon/redeem", redeem_body(),
                   bearer(tok, {"X-User-Id": str(b), "x-user-id": str(b)}))
    check(s == 200, "redeem as a: %s %s" % (s, r))
    wait_done(gw, done + 1)  # the token is in the cache from then on
    check(len(wallet_direct(en1, a)) == 1, "a holds the coupon")
    check(wallet_direct(en1, b) == [], "b holds nothing")
    # Read back through the gateway: a's wallet, whatever the forged header says.
    s, _, r = call("GET", "/api/engine/user-coupon/list", None,
                   bearer(tok, {"X-USER-ID": str(b)}))
    check(s == 200 and [c["couponTemplateId"] for c in r["data"]] == [str(tpl_id)],
          "a's wallet: %s %s" % (s, r))
    # The per-user limit counts a's claims: a second one is refused for a, not made for b.
    s, _, r = call("POST", "/api/engine/user-coupon/redeem", redeem_body(),
                   bearer(tok, {"X-User-Id": str(b)}))
    check(s == 409 and r["code"] == "B000101", "a's second claim: %s %s" % (s, r))
    check(wallet_direct(en1, b) == [], "b still holds nothing")
    # The token's second and third requests were taken from the cache of verified tokens.
    m = metrics(gw)
    check(m['quan_gateway_token_cache_total{result="hit"}'] == hits + 2,
          "cache hits: %s then %s" % (hits, m))


def test_token_cache():
    """A token verified once is taken from the cache until a second before its exp, then
    refused as expired; the cache is keyed by the whole token (another signature of the same
    header and payload is verified, and refused); a refused token is never cached."""
    user = new_user()
    tok = mint("--user", user, "--ttl", 4)
    exp = json.loads(base64.urlsafe_b64decode(tok.split(".")[1] + "=="))["exp"]
    m0 = metrics(gw)
    done = answered(gw)
    for i in range(3):
        s, _, r = call("GET", "/api/engine/user-coupon/list", None, bearer(tok))
        check(s == 200, "request %d of a fresh token: %s %s" % (i, s, r))
        wait_done(gw, done + i + 1)
    hit = 'quan_gateway_token_cache_total{result="hit"}'
    miss = 'quan_gateway_token_cache_total{result="miss"}'
    m1 = metrics(gw)
    check(m1[miss] - m0[miss] == 1 and m1[hit] - m0[hit] == 2,
          "one miss, then two hits: %s -> %s" % (m0, m1))
    # The same header and payload with another signature: not the cached token.
    h, p, sig = tok.split(".")
    other = "%s.%s.%s" % (h, p, sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB"))
    refused(bearer(other), "bad token signature")
    # Past its exp the token is refused, cache or not.
    time.sleep(max(0, exp - time.time()) + 0.2)
    refused(bearer(tok), "token expired")
    # A refused token is verified each time it comes.
    m2 = metrics(gw)
    for _ in range(2):
        refused(bearer(tok), "token expired")
    m3 = metrics(gw)
    check(m3[hit] == m2[hit] and m3[miss] - m2[miss] == 2,
          "an expired token, twice: two misses: %s -> %s" % (m2, m3))


def test_forged_shop_is_removed():
    # A merchant token without a shop claim, and a forged X-Shop-Number: the service sees no
    # shop at all and answers its own missing-shop 401.
    tok = mint("--user", MERCHANT)
    s, _, r = call("GET", "/api/merchant-admin/coupon-template/find?couponTemplateId=%d" % tpl_id,
                   None, bearer(tok, {"X-Shop-Number": str(SHOP)}))
    check(s == 401 and r["code"] == "A000401" and "X-Shop-Number" in r["message"],
          "forged shop: %s %s" % (s, r))
    # With the shop claim of another shop, the forged header of the right shop changes
    # nothing: the template is not that shop's.
    tok = mint("--user", MERCHANT, "--shop", SHOP + 1)
    s, _, r = call("GET", "/api/merchant-admin/coupon-template/find?couponTemplateId=%d" % tpl_id,
                   None, bearer(tok, {"X-Shop-Number": str(SHOP)}))
    check(s == 404, "another shop's token: %s %s" % (s, r))


def test_username_from_the_token_only():
    # setup created the template with --name alice and a forged X-Username: mallory.
    s, _, r = request("GET", ma.url + "/api/merchant-admin/coupon-template/log?couponTemplateId=%d"
                      % tpl_id, None, {"X-User-Id": str(MERCHANT), "X-Shop-Number": str(SHOP)})
    check(s == 200 and len(r["data"]) == 1, "log: %s %s" % (s, r))
    text = r["data"][0]["operationLog"]
    check("alice (user %d)" % MERCHANT in text and "mallory" not in text, "log text: %s" % text)
    check(r["data"][0]["shopNumber"] == str(SHOP), "the token's shop: %s" % r["data"][0])


# ---------------------------------------------------------------- request ids, bodies


def test_request_id_and_traceparent_pass_through():
    tok = user_token(new_user())
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    s, rh, r = call("GET", "/api/engine/user-coupon/list", None,
                    bearer(tok, {"X-Request-Id": "gw-pass.42:x", "traceparent": tp}))
    check(s == 200 and r["requestId"] == "gw-pass.42:x", "request id: %s %s" % (s, r))
    check(rh.get("X-Request-Id") == "gw-pass.42:x", "header: %s" % rh)
    check(rh.get("traceparent", "").startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
          "the caller's trace goes on: %s" % rh.get("traceparent"))
    # None sent: the service makes them (the gateway invents nothing).
    s, rh, r = call("GET", "/api/engine/user-coupon/list", None, bearer(tok))
    check(s == 200 and len(r["requestId"]) == 32 and rh.get("traceparent"), "%s %s" % (s, rh))


def test_body_limit():
    tok = user_token(new_user())
    head = ("POST /api/engine/user-coupon/redeem HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
            "\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n")
    out = raw_http(gw["port"], (head % (tok, 1048577)).encode() + b" " * 1048577)
    check(out.startswith(b"HTTP/1.1 413"), "1 MiB + 1: %r" % out[:100])
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    check(is_envelope(body, "A000001") and "1048576" in body["message"], "413 body: %s" % body)
    # Exactly 1 MiB reaches the engine, which reads it (and refuses what it says).
    pad = b'{"source":0,"x":"' + b"a" * (1048576 - 22) + b'"}'
    pad += b" " * (1048576 - len(pad))
    out = raw_http(gw["port"], (head % (tok, len(pad))).encode() + pad)
    check(out.startswith(b"HTTP/1.1 400"), "1 MiB: %r" % out[:100])
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    check(body["code"] == "A000001" and "exceeds" not in body["message"], "400 body: %s" % body)


# ---------------------------------------------------------------- replicas


def test_replica_killed_gets_and_posts_go_to_the_other():
    global en2
    en2.signal(signal.SIGKILL)
    en2.wait_exit(10)
    tok = user_token(new_user())
    for i in range(20):
        s, _, r = call("GET", "/api/engine/user-coupon/list", None, bearer(tok))
        check(s == 200, "GET %d with a replica dead: %s %s" % (i, s, r))
    users = [new_user() for _ in range(10)]
    for u in users:
        s, _, r = call("POST", "/api/engine/user-coupon/redeem", redeem_body(),
                       bearer(user_token(u)))
        check(s == 200, "POST with a replica dead: %s %s" % (s, r))
    for u in users:
        check(len(wallet_direct(en1, u)) == 1, "user %d: one coupon" % u)
    en2 = Service("engine", port=en2.port, replicas=1).wait_ready()


def hung_requests(g, method, path, body_of, victim, headers_of):
    """Sends requests through g, one at a time, until some hang (they went to the stopped
    victim); returns [(user, thread result holder)] of those that hang."""
    hung = []
    for _ in range(8):
        u = new_user()
        box = {}

        def send(u=u, box=box):
            box["resp"] = call(method, path, body_of(u), headers_of(u), g=g, timeout=30)

        t = threading.Thread(target=send)
        t.start()
        t.join(1.0)
        if t.is_alive():
            hung.append((u, box, t))
            if len(hung) >= 2:
                break
        else:
            check(box["resp"][0] == 200, "not the victim: %s" % (box["resp"],))
    check(hung, "no request went to the stopped replica (%d)" % victim.port)
    return hung


def test_post_not_retried_when_the_replica_dies_holding_it():
    # A fresh gateway (no replica marked failed, no idle connection to the victim). The victim
    # is stopped: the kernel still accepts its connections and takes the request, nobody reads
    # it; then it is killed, and the gateway's connection is reset after the POST was sent.
    victim = Service("engine", replicas=1).wait_ready()
    g = start_gateway([victim, en1], "post")
    try:
        victim.signal(signal.SIGSTOP)
        hung = hung_requests(g, "POST", "/api/engine/user-coupon/redeem",
                             lambda u: redeem_body(), victim, lambda u: bearer(user_token(u)))
        victim.signal(signal.SIGKILL)
        for u, box, t in hung:
            t.join(20)
            s, _, r = box["resp"]
            check(s == 502 and is_envelope(r, "C000001"), "the dead replica's POST: %s %s" % (s, r))
            check(wallet_direct(en1, u) == [], "user %d: the POST was not sent again" % u)
    finally:
        victim.signal(signal.SIGKILL)
        victim.stop()
        stop_gateway(g)


def test_get_retried_when_the_replica_dies_holding_it():
    victim = Service("engine", replicas=1).wait_ready()
    g = start_gateway([victim, en1], "get")
    try:
        victim.signal(signal.SIGSTOP)
        hung = hung_requests(g, "GET", "/api/engine/user-coupon/list", lambda u: None, victim,
                             lambda u: bearer(user_token(u)))
        victim.signal(signal.SIGKILL)
        for u, box, t in hung:
            t.join(20)
            s, _, r = box["resp"]
            check(s == 200 and r["data"] == [], "the dead replica's GET, sent again: %s %s"
                  % (s, r))
    finally:
        victim.signal(signal.SIGKILL)
        victim.stop()
        stop_gateway(g)


def test_both_replicas_serve():
    # Back to two engines (en2 restarted): requests reach both (the access log names them).
    tok = user_token(new_user())
    log = os.path.join(gw["dir"], "logs", "access.log")

    def both():
        call("GET", "/api/engine/user-coupon/list", None, bearer(tok))
        with open(log) as f:
            seen = {json.loads(line)["upstream"] for line in f.readlines()[-20:]}
        return {"127.0.0.1:%d" % en1.port, "127.0.0.1:%d" % en2.port} <= seen

    check(wait_for(both, 30), "both replicas in the access log")
    with open(log) as f:
        last = json.loads(f.readlines()[-1])
    check(last["status"] == 200 and last["userId"] and "Authorization" not in json.dumps(last),
          "access log line: %s" % last)


def upstream_time_waits():
    """Connections from the gateway to the engines that nginx has closed (TIME_WAIT on its
    side, the engine's port as the peer)."""
    out = subprocess.run(["ss", "-Htan", "state", "time-wait"], capture_output=True, text=True,
                         timeout=10).stdout
    ports = {":%d" % en1.port, ":%d" % en2.port}
    return sum(1 for line in out.splitlines()
               if line.split() and any(line.split()[-1].endswith(p) for p in ports))


def test_upstream_connections_reused_under_concurrency():
    """64 clients on keep-alive connections: the gateway keeps its connections to the engines
    open between requests, instead of one new connection per request beyond a small idle pool
    (every closed one sits in TIME_WAIT: under load the local ports run out)."""
    tok = user_token(new_user())
    clients, rounds = 64, 30
    statuses, lock = [], threading.Lock()
    barrier = threading.Barrier(clients)

    def client():
        c = http.client.HTTPConnection("127.0.0.1", gw["port"], timeout=10)
        barrier.wait()
        got = []
        for _ in range(rounds):
            c.request("GET", "/api/engine/user-coupon/list", headers=bearer(tok))
            r = c.getresponse()
            r.read()
            got.append(r.status)
        c.close()
        with lock:
            statuses.extend(got)

    before = upstream_time_waits()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    closed = upstream_time_waits() - before
    check(statuses == [200] * (clients * rounds),
          "statuses %s" % {x: statuses.count(x) for x in set(statuses)})
    check(closed <= clients // 8, "%d upstream connections closed for %d requests" %
          (closed, clients * rounds))


# ---------------------------------------------------------------- rate limits


class Client:
    """A client on its own keep-alive connection from a source address of its own (any of
    127.0.0.0/8 reaches the gateway on 127.0.0.1): the gateway tells clients apart by address.
    Every answer of a rate limit is checked (429, Retry-After, the envelope) and counted in
    limited[gateway dir]."""

    def __init__(self, g, addr="127.0.0.1", token=None):
        self.g, self.addr, self.token, self.c = g, addr, token, None

    def close(self):
        if self.c:
            self.c.close()
            self.c = None

    def call(self, method, path, body=None, headers=None):
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        if self.c is None:
            self.c = http.client.HTTPConnection("127.0.0.1", self.g["port"], timeout=20,
                                                source_address=(self.addr, 0))
        try:
            self.c.request(method, path, body=data, headers=h)
            r = self.c.getresponse()
            raw = r.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        try:
            js = json.loads(raw)
        except ValueError:
            js = raw
        if r.status == 429 and isinstance(js, dict) and "rate limit of the gateway" in str(
                js.get("message")):
            check(is_envelope(js, "A000429") and r.headers.get("Retry-After") == "1" and
                  r.headers.get("X-Request-Id") == js["requestId"] and
                  r.headers.get("Content-Type") == "application/json",
                  "the limit's 429: %s %s" % (dict(r.headers), js))
            with limited_lock:
                limited[self.g["dir"]] = limited.get(self.g["dir"], 0) + 1
        return r.status, r.headers, js


limited = {}  # gateway dir -> the limits' 429s its clients were answered
limited_lock = threading.Lock()


def limited_by_gateway(answer):
    s, _, r = answer
    return s == 429 and isinstance(r, dict) and "rate limit of the gateway" in str(r["message"])


def burst(clients, method, path, n_each=1, body=None):
    """Every client sends n_each requests one after the other, all clients at once; the
    answers of each client in order."""
    barrier = threading.Barrier(len(clients))
    out = [None] * len(clients)

    def one(i):
        barrier.wait()
        out[i] = [clients[i].call(method, path, body) for _ in range(n_each)]
        clients[i].close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def limits_gateway(name, **limits):
    """A gateway of its own with the limits given (the others off), in front of the engines."""
    env = dict(LIMITS_OFF)
    env.update({"QUAN_GATEWAY_%s" % k.upper(): v for k, v in limits.items()})
    return start_gateway([en1, en2], name, env)


def test_limit_per_user():
    """A burst of one user past QUAN_GATEWAY_RATE_USER is refused 429 (checked by Client), while
    another user at the same moment, from the same address, is served; the user's budget is
    the same on /api/settlement/, and comes back after Retry-After."""
    g = limits_gateway("user", rate_user="2r/s burst=5")
    a, b = new_user(), new_user()
    ta, tb = user_token(a), user_token(b)
    t0 = time.time()
    out = burst([Client(g, token=ta) for _ in range(30)] + [Client(g, token=tb)],
                "GET", "/api/engine/user-coupon/list", n_each=1)
    # b's second to fifth requests while a's are refused.
    out[-1] += [Client(g, token=tb).call("GET", "/api/engine/user-coupon/list")
                for _ in range(4)]
    elapsed = time.time() - t0
    mine = [x[0] for x in out[:-1]]
    ok = sum(1 for x in mine if x[0] == 200)
    refused_ = sum(1 for x in mine if limited_by_gateway(x))
    check(ok + refused_ == 30, "a: only 200s and the limit's 429s: %s" % [x[0] for x in mine])
    # 1 + burst at once, then 2 a second.
    check(1 <= ok <= 6 + int(2 * elapsed) + 1, "a: %d served in %.1fs" % (ok, elapsed))
    check(refused_ >= 30 - 6 - int(2 * elapsed) - 1, "a: %d refused" % refused_)
    check([x[0] for x in out[-1]] == [200] * 5, "b, at the same moment: %s" % out[-1])
    # The same zone on settlement's routes (right after a refusal: the budget refills at 2 a
    # second); merchant-admin's is another one.
    ca = Client(g, token=ta)
    for _ in range(20):
        if limited_by_gateway(ca.call("GET", "/api/engine/user-coupon/list")):
            break
    s = ca.call("POST", "/api/settlement/coupon-query",
                {"orderAmount": 150, "shopNumber": str(SHOP), "goodsList": []})
    check(limited_by_gateway(s), "a on settlement: %s %s" % (s[0], s[2]))
    s = ca.call("GET", "/api/merchant-admin/coupon-template/find?couponTemplateId=%d" % tpl_id)
    check(s[0] == 401 and s[2]["code"] == "A000401" and "X-Shop-Number" in s[2]["message"],
          "a on merchant-admin: the service's answer (no shop claim): %s %s" % (s[0], s[2]))
    # Retry-After: 1, and at 2 a second the next one is served.
    time.sleep(1.1)
    s = ca.call("GET", "/api/engine/user-coupon/list")
    check(s[0] == 200, "a after Retry-After: %s %s" % (s[0], s[2]))
    ca.close()


def test_limit_per_address():
    """Many users behind one address past QUAN_GATEWAY_RATE_ADDR: 429s, while another address
    is served; requests with a refused token count against their address too (429 in place of
    401 once it is spent), and then a good token from there waits as well."""
    g = limits_gateway("addr", rate_addr="5r/s burst=10", rate_user="100r/s burst=100")
    users = [new_user() for _ in range(40)]
    t0 = time.time()
    out = burst([Client(g, "127.0.0.2", user_token(u)) for u in users] +
                [Client(g, "127.0.0.3", user_token(new_user())) for _ in range(5)],
                "GET", "/api/engine/user-coupon/list")
    elapsed = time.time() - t0
    nat = [x[0] for x in out[:40]]
    ok = sum(1 for x in nat if x[0] == 200)
    refused_ = sum(1 for x in nat if limited_by_gateway(x))
    check(ok + refused_ == 40 and 1 <= ok <= 11 + int(5 * elapsed) + 1,
          "40 users behind one address: %d served, %d refused in %.1fs" % (ok, refused_,
                                                                           elapsed))
    check(refused_ > 0, "the address is limited")
    check([x[0][0] for x in out[40:]] == [200] * 5, "another address: %s" % out[40:])
    # The address's limit comes before the token: those it refused were never verified (the
    # access log's userId is the verified token's), the others were.
    wait_for(lambda: len(access_log(g)) >= 45, 5)
    lines = [x for x in access_log(g) if x["remote"] == "127.0.0.2"]
    check(len(lines) == 40 and
          all(x["userId"] == "" for x in lines if x["status"] == 429) and
          sorted(x["userId"] for x in lines if x["status"] == 200) ==
          sorted(str(u) for u, x in zip(users, nat) if x[0] == 200),
          "users in the log: %s" % [(x["status"], x["userId"]) for x in lines])
    # A flood without a token: 401 for the first, then 429; a good token there waits too.
    c = Client(g, "127.0.0.4")
    codes = [c.call("GET", "/api/engine/user-coupon/list")[0] for _ in range(25)]
    check(codes[0] == 401 and codes.count(429) >= 25 - 11 - 2 and set(codes) == {401, 429},
          "no token: %s" % codes)
    c.token = user_token(new_user())
    s = c.call("GET", "/api/engine/user-coupon/list")
    check(limited_by_gateway(s), "a good token from the spent address: %s %s" % (s[0], s[2]))
    c.close()


def test_limit_merchant_routes():
    """/api/merchant-admin/ has a per-user zone of its own (QUAN_GATEWAY_RATE_MERCHANT): a
    merchant gets more there than the user limit allows, is refused past it, and their user
    budget on the engine is untouched."""
    g = limits_gateway("merchant", rate_user="1r/s burst=1", rate_merchant="2r/s burst=8")
    tok = mint("--user", MERCHANT + 7, "--shop", SHOP)
    t0 = time.time()
    out = burst([Client(g, token=tok) for _ in range(25)], "GET",
                "/api/merchant-admin/coupon-template/find?couponTemplateId=%d" % tpl_id)
    elapsed = time.time() - t0
    codes = [x[0][0] for x in out]
    ok = codes.count(200)
    refused_ = sum(1 for x in out if limited_by_gateway(x[0]))
    check(ok + refused_ == 25, "merchant: %s" % codes)
    check(9 <= ok <= 9 + int(2 * elapsed) + 1, "merchant: %d served in %.1fs (more than the "
          "user limit's 2)" % (ok, elapsed))
    c = Client(g, token=tok)
    check([c.call("GET", "/api/engine/user-coupon/list")[0] for _ in range(2)] == [200, 200],
          "the same user on the engine: its own budget")
    c.close()


def test_console_not_limited_by_the_api_limit():
    """The console's files count in a zone of their own (QUAN_GATEWAY_RATE_CONSOLE): an address
    whose API budget is spent still loads the console, up to its own limit."""
    g = limits_gateway("console", rate_addr="1r/s burst=1", rate_console="2r/s burst=15")
    c = Client(g, "127.0.0.5", user_token(new_user()))
    codes = [c.call("GET", "/api/engine/user-coupon/list")[0] for _ in range(5)]
    check(codes.count(429) >= 2, "the API budget spent: %s" % codes)
    files = ["/console/", "/console/console.js", "/console/console.css"] * 5
    got = [c.call("GET", f) for f in files]
    codes = [s for s, _, _ in got]
    check(codes == [200] * 15, "the console meanwhile: %s" % codes)
    check(b"<html" in got[0][2].lower(), "the page: %r" % got[0][2][:80])
    more = [c.call("GET", "/console/console.css") for _ in range(10)]
    check(any(limited_by_gateway(x) for x in more),
          "past its own limit: %s" % [x[0] for x in more])
    c.close()


def test_limit_conn_per_address():
    """QUAN_GATEWAY_CONN_ADDR: with two requests of one address held (their engine stopped), a
    third from it is refused 429 at once, console files included; another address is not."""
    victim = Service("engine", replicas=1).wait_ready()
    g = start_gateway([victim], "conn", dict(LIMITS_OFF, QUAN_GATEWAY_CONN_ADDR="2"))
    held = []
    try:
        victim.signal(signal.SIGSTOP)
        for _ in range(2):
            box = {}

            def send(box=box):
                c = Client(g, "127.0.0.6", user_token(new_user()))
                box["resp"] = c.call("GET", "/api/engine/user-coupon/list")
                c.close()

            t = threading.Thread(target=send)
            t.start()
            held.append((box, t))
        time.sleep(0.5)
        check(all(t.is_alive() for _, t in held), "two requests held")
        c = Client(g, "127.0.0.6", user_token(new_user()))
        s = c.call("GET", "/api/engine/user-coupon/list")
        check(limited_by_gateway(s), "a third from that address: %s %s" % (s[0], s[2]))
        s = c.call("GET", "/console/console.css")
        check(limited_by_gateway(s), "a console file from that address: %s" % s[0])
        c.close()
        s = Client(g, "127.0.0.7").call("GET", "/console/console.css")
        check(s[0] == 200, "another address: %s" % s[0])
        # Both refusals counted, as the connection limit's (once each is logged).
        wait_for(lambda: refusals(metrics(g), "connection") >= 2, 5)
        m = metrics(g)
        check(refusals(m, "connection") == 2 and
              all(refusals(m, x) == 0 for x in ("address", "user", "merchant", "console")),
              "the refusals in /metrics: %s" % m)
    finally:
        victim.signal(signal.SIGCONT)
        for box, t in held:
            t.join(20)
        victim.stop()
        stop_gateway(g)
    check([box.get("resp", (0,))[0] for box, _ in held] == [200, 200],
          "the held requests, once the engine goes on: %s" % [box.get("resp") for box, _ in held])


def access_log(g):
    with open(os.path.join(g["dir"], "logs", "access.log")) as f:
        return [json.loads(line) for line in f]


def test_limited_requests_are_counted_in_the_access_log():
    """Every 429 a limit gave is a line whose limitReq or limitConn is REJECTED, and no other
    line is: the count the gateway's refusals are measured by (deploy/gateway/README.md)."""
    seen = dict(limited)
    check(sum(seen.values()) > 0, "the tests above were refused: %s" % seen)
    for g in gateways:
        if g["dir"] not in seen:
            continue

        def counted(g=g):
            lines = access_log(g)
            return sum(1 for x in lines if "REJECTED" in (x["limitReq"], x["limitConn"]))

        # The access log is written every 100 ms.
        wait_for(lambda g=g: counted(g) >= seen[g["dir"]], 5)
        lines = access_log(g)
        rejected = [x for x in lines if "REJECTED" in (x["limitReq"], x["limitConn"])]
        check(len(rejected) == seen[g["dir"]] and all(x["status"] == 429 for x in rejected),
              "%s: %d lines REJECTED, %d refusals seen" % (g["dir"], len(rejected),
                                                          seen[g["dir"]]))
        passed = [x for x in lines if x["status"] == 200 and x["uri"].startswith("/api/")]
        check(passed and all(x["limitReq"] in ("PASSED", "") and x["limitConn"] in ("PASSED", "")
                             for x in passed), "%s: the 200s passed" % g["dir"])


def test_refusals_counted_in_metrics():
    """The gateway's /metrics counts each limit's 429s apart: bursts, each past one limit only
    (from addresses of their own), raise that limit's counter by the number of 429s the
    clients were answered, and no other; the gateway's own 401s are counted, a service's
    are not; only the metrics port serves /metrics."""
    g = limits_gateway("metrics", rate_user="1r/m burst=3", rate_addr="1r/m burst=20",
                       rate_merchant="1r/m burst=2", rate_console="1r/m burst=2")
    limits = ("address", "user", "merchant", "console", "connection")
    m0 = metrics(g)
    check(all(refusals(m0, x) == 0 for x in limits) and
          m0["quan_gateway_unauthorized_total"] == 0, "a new gateway: %s" % m0)

    def send(addr, n, path, token=None):
        c = Client(g, addr, token)
        out = [c.call("GET", path) for _ in range(n)]
        c.close()
        return out

    seen = {}
    # One user, from an address of its own far from its limit: the user's limit alone refuses.
    out = send("127.0.0.21", 10, "/api/engine/user-coupon/list", user_token(new_user()))
    seen["user"] = sum(1 for x in out if limited_by_gateway(x))
    check(seen["user"] >= 5 and all(x[0] == 200 or limited_by_gateway(x) for x in out),
          "one user's burst: %s" % [x[0] for x in out])
    # No token from another address: no user to count, the address's limit refuses; the rest
    # are the gateway's 401s.
    out = send("127.0.0.22", 30, "/api/engine/user-coupon/list")
    seen["address"] = sum(1 for x in out if limited_by_gateway(x))
    unauthorized = sum(1 for x in out if x[0] == 401)
    check(seen["address"] >= 5 and unauthorized >= 20 and
          seen["address"] + unauthorized == 30, "no token: %s" % [x[0] for x in out])
    # Merchant routes, a token without a shop: the service's own 401s (not the gateway's),
    # then the merchant limit's 429s.
    out = send("127.0.0.23", 6,
               "/api/merchant-admin/coupon-template/find?couponTemplateId=%d" % tpl_id,
               mint("--user", MERCHANT))
    seen["merchant"] = sum(1 for x in out if limited_by_gateway(x))
    check(seen["merchant"] >= 2 and
          all(x[0] == 401 and "X-Shop-Number" in x[2]["message"] for x in out
              if not limited_by_gateway(x)), "merchant: %s" % [x[0] for x in out])
    out = send("127.0.0.24", 6, "/console/console.css")
    seen["console"] = sum(1 for x in out if limited_by_gateway(x))
    check(seen["console"] >= 2, "console: %s" % [x[0] for x in out])
    seen["connection"] = 0

    def counted():
        m = metrics(g)
        return all(refusals(m, x) == seen[x] for x in limits) and \
            m["quan_gateway_unauthorized_total"] == unauthorized
    wait_for(counted, 5)
    m = metrics(g)
    check(all(refusals(m, x) == seen[x] for x in limits),
          "refusals by limit: seen %s, counted %s" % (seen, m))
    check(m["quan_gateway_unauthorized_total"] == unauthorized,
          "401s: %d seen, %s counted" % (unauthorized, m["quan_gateway_unauthorized_total"]))
    check(m.get('quan_gateway_requests_total{route="user",status="429"}') ==
          seen["user"] + seen["address"] and
          m.get('quan_gateway_requests_total{route="merchant",status="401"}') ==
          6 - seen["merchant"], "requests by route and status: %s" % m)
    check(m['quan_gateway_connections{state="active"}'] >= 1, "connections: %s" % m)
    # /metrics is not on the clients' port, nor anything else on the metrics port.
    s, _, r = call("GET", "/metrics", None, None, g=g)
    check(s == 404, "/metrics on the clients' port: %s" % s)
    s, _, r = request("GET", g["metrics"].replace("/metrics", "/api/engine/user-coupon/list"))
    check(s == 404, "the metrics port serves /metrics only: %s" % s)
    stop_gateway(g)


def test_flash_sale_under_the_default_limits():
    """A flash sale through a gateway with the default limits (none set): 200 shoppers, 80 of
    them behind two addresses (a NAT of 40 each), the rest on addresses of their own, all at
    once. Each client loads the page (the template, the wallet), claims through /redeem-mq,
    polls /redeem-result every 250 ms until it settles and asks again after a 429 or 503
    (Retry-After); every fifth taps the claim twice. The stock (150) goes to 150 of them, the
    others are told it is gone, and the gateway refuses none of them."""
    g = start_gateway([en1, en2], "sale", {})
    tok = mint("--user", MERCHANT, "--shop", SHOP)
    s, _, r = call("POST", "/api/merchant-admin/coupon-template/create",
                   {"name": "gw-sale-%x" % random.getrandbits(32), "source": 0, "target": 1,
                    "type": 0, "validStartTime": "2025-01-01 00:00:00",
                    "validEndTime": "2035-01-01 00:00:00", "stock": 150,
                    "receiveRule": {"limitPerPerson": 1, "usageInstructions": "t"},
                    "consumeRule": {"maximumDiscountAmount": 5, "validityPeriod": 48}},
                   bearer(tok), g=g)
    check(s == 200, "the sale's template: %s %s" % (s, r))
    sale = int(r["data"]["id"])
    shoppers = [(new_user(), "127.0.1.%d" % (1 + i // 40) if i < 80 else
                 "127.0.2.%d" % (i - 79)) for i in range(200)]
    outcome, answers = {}, {}
    lock = threading.Lock()
    barrier = threading.Barrier(len(shoppers))

    def ask(c, method, path, body=None):
        """Again after a 429 or 503, as Retry-After says, for 30 s at most."""
        deadline = time.time() + 30
        while True:
            s, h, r = c.call(method, path, body)
            with lock:
                answers[s] = answers.get(s, 0) + 1
            if s not in (429, 503) or time.time() > deadline:
                return s, r
            time.sleep(float(h.get("Retry-After") or 1))

    def shopper(i):
        user, addr = shoppers[i]
        c = Client(g, addr, user_token(user))
        barrier.wait()
        ask(c, "GET", "/api/engine/coupon-template/query?shopNumber=%d&couponTemplateId=%d"
            % (SHOP, sale))
        ask(c, "GET", "/api/engine/user-coupon/list")
        got = None
        for n in range(2 if i % 5 == 0 else 1):
            rid = "sale-%d-%d" % (user, n)
            s, r = ask(c, "POST", "/api/engine/user-coupon/redeem-mq",
                       {"source": 0, "shopNumber": str(SHOP), "couponTemplateId": str(sale),
                        "requestId": rid})
            if s == 202:
                deadline = time.time() + 30
                while time.time() < deadline:
                    time.sleep(0.25)
                    s, r = ask(c, "GET", "/api/engine/user-coupon/redeem-result?requestId="
                               + rid)
                    if s != 200 or r["data"]["status"] != "PENDING":
                        break
                if s == 200 and r["data"]["status"] == "SUCCESS":
                    got = got or "coupon"
                    continue
            got = got or "%s %s" % (s, r.get("code") if isinstance(r, dict) else r)
        c.close()
        with lock:
            outcome[user] = got

    t0 = time.time()
    threads = [threading.Thread(target=shopper, args=(i,)) for i in range(len(shoppers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - t0
    kinds = {}
    for v in outcome.values():
        kinds[v] = kinds.get(v, 0) + 1
    check(len(outcome) == 200 and kinds.get("coupon") == 150 and
          kinds.get("409 B000100") == 50, "outcomes in %.1fs: %s" % (took, kinds))
    check(limited.get(g["dir"], 0) == 0, "the gateway refused %d requests (answers: %s)"
          % (limited.get(g["dir"], 0), answers))
    wait_for(lambda: len(access_log(g)) >= sum(answers.values()), 5)
    rejected = [x for x in access_log(g) if "REJECTED" in (x["limitReq"], x["limitConn"])]
    check(not rejected, "REJECTED in the access log: %s" % rejected[:3])
    print("     flash sale: %d shoppers, %d requests in %.1fs, answers %s" % (
        len(shoppers), sum(answers.values()), took, answers), flush=True)
    stop_gateway(g)


def test_default_limits_are_the_k8s_ones():
    """gateway.sh's limits.conf for no QUAN_GATEWAY_RATE_* is deploy/gateway/k8s/limits.conf,
    byte for byte (one set of defaults, documented in one place)."""
    env = {k: v for k, v in os.environ.items() if k not in LIMITS_OFF}
    r = subprocess.run(["bash", GATEWAY_SH, "limits"], env=env, capture_output=True, text=True,
                       timeout=10)
    with open(os.path.join(ROOT, "deploy", "gateway", "k8s", "limits.conf")) as f:
        check(r.returncode == 0 and r.stdout == f.read(), "gateway.sh limits: %s %s" % (
            r.returncode, r.stderr))
    with open(os.path.join(gw["dir"], "limits.conf")) as f:
        text = f.read()
    directives = [x for x in text.splitlines() if x.strip() and not x.startswith("#")]
    check(directives == [], "the main gateway runs without limits: %s" % directives)


# ---------------------------------------------------------------- gateway.sh


def sh(cmd, d, env=None):
    return subprocess.run(["bash", GATEWAY_SH, cmd, d], env=env or gw["env"], capture_output=True,
                          text=True, timeout=60)


def gone(pid):
    """pid has exited (or is a zombie nobody reaped yet)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[1][0] == "Z"
    except OSError:
        return True


def test_gateway_sh():
    r = sh("status", gw["dir"])
    check(r.returncode == 0 and "gateway alive pid" in r.stdout, "status: %s" % r.stdout)
    r = sh("start", gw["dir"])
    check(r.returncode == 0 and "already running" in r.stderr, "start again: %s" % r.stderr)
    for f in ("nginx.conf", "quan_auth.js"):
        with open(os.path.join(ROOT, "deploy", "gateway", f)) as a, \
                open(os.path.join(gw["dir"], f)) as b:
            check(a.read() == b.read(), "%s is deploy/gateway's" % f)

    d = tempfile.mkdtemp(prefix="gateway-sh.", dir=TMP)
    gateways.append({"dir": d})  # stopped by teardown too, should a check below fail
    env = dict(gw["env"], QUAN_GATEWAY_PORT=str(free_port()),
               QUAN_GATEWAY_METRICS_PORT=str(free_port()))
    del env["QUAN_GATEWAY_JWT_SECRET"]
    r = sh("start", d, env)
    check(r.returncode == 0, "start with a made key: %s" % r.stderr)
    with open(os.path.join(d, "jwt-secret")) as f:
        made = f.read().strip()
    check(len(made) == 64 and (os.stat(os.path.join(d, "jwt-secret")).st_mode & 0o077) == 0,
          "jwt-secret: 64 hex digits, 0600")
    g = {"url": "http://127.0.0.1:%s" % env["QUAN_GATEWAY_PORT"]}
    s, _, _ = call("GET", "/api/engine/user-coupon/list", None,
                   bearer(mint("--user", new_user(), key=made)), g=g)
    check(s == 200, "a token of the made key: %s" % s)
    s, _, _ = call("GET", "/api/engine/user-coupon/list", None, bearer(user_token(new_user())),
                   g=g)
    check(s == 401, "a token of another key: %s" % s)
    with open(os.path.join(d, "gateway.pid")) as f:
        pid = int(f.read().split()[0])
    r = sh("stop", d, env)
    check(r.returncode == 0 and gone(pid), "stopped: %s" % r.stderr)
    r = sh("status", d, env)
    check(r.returncode == 3 and "dead" in r.stdout, "status after stop: %s" % r.stdout)
    check(sh("stop", d, env).returncode == 0, "stop twice")
    check(sh("stop", os.path.join(d, "none"), env).returncode == 0, "stop a missing DIR")

    # The key as a file, as in Kubernetes: the workers read it (as root they run as nobody, who
    # is then its owner, mode 0400 as a mounted Secret's file).
    key_file = os.path.join(TMP, "gateway-key-%d" % os.getpid())

    def write_key(text):
        with open(key_file, "w") as f:
            f.write(text + "\n")
        if os.geteuid() == 0:
            os.chown(key_file, int(subprocess.check_output(["id", "-u", "nobody"])), -1)
        os.chmod(key_file, 0o400)

    file_key = "gw-file-key-%016x" % random.getrandbits(64)
    write_key(file_key)
    fenv = dict(env, QUAN_GATEWAY_JWT_SECRET_FILE=key_file)
    r = sh("start", d, fenv)
    check(r.returncode == 0, "start with the key in a file: %s" % r.stderr)
    s, _, _ = call("GET", "/api/engine/user-coupon/list", None,
                   bearer(mint("--user", new_user(), key=file_key)), g=g)
    check(s == 200, "a token of the file's key: %s" % s)
    s, _, _ = call("GET", "/api/engine/user-coupon/list", None, bearer(user_token(new_user())),
                   g=g)
    check(s == 401, "a token of another key: %s" % s)
    # quan-token reads the same file the same way.
    r = subprocess.run([TOKEN, "--user", str(new_user())], capture_output=True, text=True,
                       timeout=10, env=dict(os.environ, QUAN_GATEWAY_JWT_SECRET="",
                                            QUAN_GATEWAY_JWT_SECRET_FILE=key_file))
    s, _, _ = call("GET", "/api/engine/user-coupon/list", None, bearer(r.stdout.strip()), g=g)
    check(r.returncode == 0 and s == 200, "quan-token with the file: %s %s" % (r.stderr, s))
    # A token verified under the file's key, cached (its second request a hit)...
    kept = mint("--user", new_user(), key=file_key)
    for i in range(2):
        s, _, _ = call("GET", "/api/engine/user-coupon/list", None, bearer(kept), g=g)
        check(s == 200, "a cached token of the file's key, request %d: %s" % (i, s))
    rotated = "gw-rotated-key-%016x" % random.getrandbits(64)
    os.chmod(key_file, 0o600)
    write_key(rotated)
    # ... is verified again under the new key within a second of it, and refused.
    time.sleep(1.3)
    s, _, _ = call("GET", "/api/engine/user-coupon/list", None, bearer(kept), g=g)
    check(s == 401, "a cached token of the key written over: %s" % s)
    s, _, _ = call("GET", "/api/engine/user-coupon/list", None,
                   bearer(mint("--user", new_user(), key=rotated)), g=g)
    check(s == 200, "a token of the key written over the file, without a restart: %s" % s)
    with open(os.path.join(d, "gateway.pid")) as f:
        pid = int(f.read().split()[0])
    # The master's environment, and the workers' where this user may read them (they run as
    # nobody: not without root's CAP_SYS_PTRACE, absent in a container or for a sudo user). A
    # worker's environment is made of the master's (nginx's env directives), so the master's
    # tells already.
    for p in [pid] + [int(x) for x in subprocess.check_output(["pgrep", "-P", str(pid)],
                                                              text=True).split()]:
        try:
            with open("/proc/%d/environ" % p, "rb") as f:
                environ = f.read()
        except PermissionError:
            check(p != pid, "cannot read the environment of the nginx master %d" % p)
            continue
        check(file_key.encode() not in environ and rotated.encode() not in environ,
              "the key is in the environment of nginx pid %d" % p)
    check(sh("stop", d, fenv).returncode == 0, "stop")
    os.chmod(key_file, 0o600)

    # Refused configurations start nothing.
    for bad, why in (({"QUAN_GATEWAY_JWT_SECRET_FILE": key_file},
                      "QUAN_GATEWAY_JWT_SECRET and QUAN_GATEWAY_JWT_SECRET_FILE are both set"),
                     ({"QUAN_GATEWAY_JWT_SECRET": "", "QUAN_GATEWAY_JWT_SECRET_FILE":
                       key_file + ".none"},
                      "QUAN_GATEWAY_JWT_SECRET_FILE: cannot read %s.none" % key_file)):
        r = sh("start", d, dict(gw["env"], QUAN_GATEWAY_PORT=str(free_port()), **bad))
        check(r.returncode != 0 and why in r.stderr, "%s: %s %s" % (bad, r.returncode, r.stderr))
        check(KEY not in r.stderr and rotated not in r.stderr, "a key is printed: %s" % r.stderr)
        check(sh("status", d, env).returncode == 3, "%s: nothing runs" % bad)
    os.unlink(key_file)
    # Refused configurations start nothing.
    for bad in ({"QUAN_GATEWAY_ENGINE": "127.0.0.1:1;include /etc/passwd"},
                {"QUAN_GATEWAY_ENGINE": "127.0.0.1"}, {"QUAN_GATEWAY_SETTLEMENT": "a b:1"},
                {"QUAN_GATEWAY_PORT": "70000"}, {"QUAN_GATEWAY_JWT_SECRET": "short"},
                {"QUAN_GATEWAY_METRICS_PORT": env["QUAN_GATEWAY_PORT"]},
                {"QUAN_GATEWAY_METRICS_PORT": "x"},
                {"QUAN_GATEWAY_PORT": str(gw["port"])}, {"QUAN_GATEWAY_RATE_USER": "5r/s"},
                {"QUAN_GATEWAY_RATE_ADDR": "5r/s burst=10;include /etc/passwd"},
                {"QUAN_GATEWAY_RATE_MERCHANT": "0r/s burst=1"},
                {"QUAN_GATEWAY_RATE_CONSOLE": "5r/h burst=1"}, {"QUAN_GATEWAY_CONN_ADDR": "0"},
                {"QUAN_GATEWAY_CONN_ADDR": "10;"}):
        r = sh("start", d, dict(env, **bad))
        check(r.returncode != 0 and "error" in r.stderr, "%s: %s %s" % (bad, r.returncode,
                                                                       r.stderr))
        check(sh("status", d, env).returncode == 3, "%s: nothing runs" % bad)
    shutil.rmtree(d, ignore_errors=True)


def teardown():
    for g in gateways:
        stop_gateway(g)
    for s in (ma, en1, en2, st):
        if s:
            s.stop()


if __name__ == "__main__":
    try:
        run([test_setup, test_unknown_paths_are_404, test_routes_reach_their_service,
             test_401_missing_token, test_401_malformed, test_401_bad_signature,
             test_401_expired_and_not_yet_valid, test_401_alg, test_401_bad_claims,
             test_401_keeps_the_request_id, test_identity_comes_from_the_token,
             test_token_cache, test_forged_shop_is_removed, test_username_from_the_token_only,
             test_request_id_and_traceparent_pass_through, test_body_limit,
             test_replica_killed_gets_and_posts_go_to_the_other,
             test_post_not_retried_when_the_replica_dies_holding_it,
             test_get_retried_when_the_replica_dies_holding_it, test_both_replicas_serve,
             test_upstream_connections_reused_under_concurrency,
             test_limit_per_user, test_limit_per_address, test_limit_merchant_routes,
             test_console_not_limited_by_the_api_limit, test_limit_conn_per_address,
             test_limited_requests_are_counted_in_the_access_log, test_refusals_counted_in_metrics,
             test_flash_sale_under_the_default_limits, test_default_limits_are_the_k8s_ones,
             test_gateway_sh])
    finally:
        teardown()
