"""The merchant console (deploy/console/) in headless Chromium driven by Selenium, served by the
gateway in front of a merchant-admin, an engine, a settlement and a distribution.

integration-tests/test_up.sh runs it against the stack deploy/local/up.sh started, as a user
meets the console after `make up`: QUAN_CONSOLE_STACK names that tree (its .run/gateway/jwt-secret
signs the token, its .run/files/ holds the sheet) and QUAN_UP_PORT the stack's base port (the
gateway on it, the services 10-40 above). Without QUAN_CONSOLE_STACK it starts the four services
and a gateway of its own on free ports (python3 integration-tests/console_browser.py, against the
servers of integration-tests/testenv.sh). Checked:
  - the static files answer without a token (HTML, CSS, JavaScript types; the CSP), the API
    behind the same gateway still wants one;
  - log in with a shop token from quan-token: the page shows the shop;
  - a template created with the form, listed and selected; an API refusal (a validEndTime in the
    past) shown in the page with the envelope's message;
  - a task started on a sheet in the file root (three valid rows and one invalid): the progress
    bar reaches 100 %, the failure report downloads into Chrome's download directory and holds
    the invalid row;
  - the statistics the page shows equal coupon-template/stats; the chart's distribution bars add
    up to the coupons issued; stock added with the page's form;
  - an exchange-code batch generated, ready, exported (the file arrives);
  - a coupon's history, or, while merchant-admin has no such route, the page's message saying so;
  - the language toggle: the labels turn Chinese;
  - no SEVERE entry in the browser's console, but the 404s of endpoints this merchant-admin does
    not have (the console asks for them and falls back) and the 400 provoked on purpose.
A screenshot of each page goes to the suite's temporary directory (QUAN_CONSOLE_SCREENSHOTS
names another one to keep them); their paths are printed.

SKIPPED (0 passed, 0 failed) without chromium, chromedriver or python3-selenium
(deploy/local/deps.sh --test installs them). The last line is "N passed, N failed"."""

import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quan import BIN, ROOT, TMP, Service, check, free_port, request, run  # noqa: E402

GATEWAY_SH = os.path.join(ROOT, "deploy", "local", "gateway.sh")
# A stack deploy/local/up.sh started (the tree it runs in) and its base port, or none.
STACK = os.environ.get("QUAN_CONSOLE_STACK", "")
UP_PORT = int(os.environ.get("QUAN_UP_PORT", "10000"))
KEY = "console-test-key-%016x" % random.getrandbits(64)  # the own gateway's (no STACK)
SHOP = random.randint(10 ** 15, 10 ** 17)
MERCHANT = random.randint(10 ** 6, 10 ** 7)
USERS = [random.randint(10 ** 12, 10 ** 13) for _ in range(3)]
# Debian's chromium and chromium-driver; QUAN_CHROMIUM, QUAN_CHROMEDRIVER name others.
CHROMIUM = os.environ.get("QUAN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = (os.environ.get("QUAN_CHROMEDRIVER") or shutil.which("chromedriver")
                or "/usr/bin/chromedriver")
MA = "/api/merchant-admin"

svcs = []
gw = None  # {"dir", "port", "url"}
driver = None
work = None  # the suite's temporary directory: file root, downloads, browser profile
shots_dir = None
downloads = None
state = {}
browser_log = []  # every entry the browser's console had, in order
# (a regular expression on the message, why it is no failure) of SEVERE entries expected
expected_severe = []


class StackService:
    """A service of the stack up.sh started: its URL (the stack is not this script's to stop)."""

    def __init__(self, name, port):
        self.name, self.port, self.url = name, port, "http://127.0.0.1:%d" % port

    def stop(self):
        pass


def skip(reason):
    print("SKIPPED: %s" % reason)
    print("0 passed, 0 failed")
    sys.exit(0)


def preflight():
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            skip("%s is missing (%s; deploy/local/deps.sh --test installs it)" % (path, pkg))
    try:
        import selenium  # noqa: F401
    except ImportError:
        skip("python3-selenium is missing (deploy/local/deps.sh --test installs it)")


# ---------------------------------------------------------------- helpers


def hdr():
    return {"X-User-Id": str(MERCHANT), "X-Shop-Number": str(SHOP)}


def ma_api(method, path, body=None):
    """merchant-admin directly, as the shop (what the page should show)."""
    return request(method, svcs[0].url + MA + path, body, hdr())


def route_missing(path):
    """True when merchant-admin has no route at path (its own 404 for the path)."""
    s, _, r = ma_api("GET", path)
    return s == 404 and isinstance(r, dict) and str(r.get("message", "")).startswith("no such path")


def mint():
    """A shop token, made as README says: quan-token with the gateway's key (up.sh's key file)."""
    env = dict(os.environ, QUAN_GATEWAY_JWT_SECRET=KEY)
    key = []
    if STACK:
        del env["QUAN_GATEWAY_JWT_SECRET"]
        key = ["--secret-file", os.path.join(STACK, ".run", "gateway", "jwt-secret")]
    r = subprocess.run([os.path.join(BIN, "quan-token")] + key +
                       ["--user", str(MERCHANT), "--shop", str(SHOP), "--name", "console-test"],
                       env=env, capture_output=True, text=True, timeout=10)
    check(r.returncode == 0, "quan-token: %s %s" % (r.returncode, r.stderr))
    return r.stdout.strip()


def css(sel):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.CSS_SELECTOR, sel)


def css_all(sel):
    from selenium.webdriver.common.by import By
    return driver.find_elements(By.CSS_SELECTOR, sel)


def until(cond, timeout, what):
    """Polls cond (exceptions count as false) every 0.2 s; its last value, or fails naming what
    and the page's error banner."""
    deadline = time.time() + timeout
    last = None
    while True:
        try:
            last = cond()
        except Exception as e:  # noqa: BLE001 - the page may be between two renders
            last = None
            err = e
        else:
            err = None
        if last:
            return last
        if time.time() >= deadline:
            banner = ""
            try:
                if css("#error").is_displayed():
                    banner = css("#error-text").text
            except Exception:  # noqa: BLE001
                pass
            raise AssertionError("timed out after %ss waiting for %s (error banner: %r; %s)"
                                 % (timeout, what, banner, err))
        time.sleep(0.2)


def click(sel):
    """Clicks what sel finds, found again if the poll drew it anew meanwhile."""
    until(lambda: css(sel).click() or True, 5, "a click on %s" % sel)


def fill(sel, value):
    e = css(sel)
    e.clear()
    e.send_keys(str(value))


def tab(name):
    css('#tabs button[data-tab="%s"]' % name).click()
    until(lambda: css("#page-" + name).is_displayed(), 5, "the %s page" % name)


def shot(name):
    path = os.path.join(shots_dir, "console-%s.png" % name)
    driver.save_screenshot(path)
    print("   screenshot %s" % path, flush=True)


def drain_log():
    browser_log.extend(driver.get_log("browser"))


def downloaded(before, timeout=20):
    """The one file that arrived in the download directory since before (a set of names), once
    Chrome finished writing it."""
    def done():
        new = [n for n in os.listdir(downloads) if n not in before]
        if len(new) == 1 and not new[0].endswith((".crdownload", ".tmp")):
            return os.path.join(downloads, new[0])
        return None
    return until(done, timeout, "a download in %s" % downloads)


def xlsx_rows(path):
    import openpyxl
    return [tuple(r) for r in openpyxl.load_workbook(path).active.iter_rows(values_only=True)]


# ---------------------------------------------------------------- setup


def start_gateway():
    d = tempfile.mkdtemp(prefix="gateway-console.", dir=TMP)
    port = free_port()
    env = dict(os.environ, QUAN_GATEWAY_PORT=str(port), QUAN_GATEWAY_JWT_SECRET=KEY,
               QUAN_GATEWAY_METRICS_PORT=str(free_port()),
               QUAN_GATEWAY_MERCHANT_ADMIN="127.0.0.1:%d" % svcs[0].port,
               QUAN_GATEWAY_ENGINE="127.0.0.1:%d" % svcs[1].port,
               QUAN_GATEWAY_SETTLEMENT="127.0.0.1:%d" % svcs[2].port)
    r = subprocess.run(["bash", GATEWAY_SH, "start", d], env=env, capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, "gateway.sh start: %s %s" % (r.returncode, r.stderr))
    return {"dir": d, "port": port, "url": "http://127.0.0.1:%d" % port}


def start_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service as ChromeService
    opts = Options()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,1500", "--lang=en-US", "--no-first-run",
              "--user-data-dir=%s" % os.path.join(work, "profile")):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    opts.add_experimental_option("prefs", {
        "download.default_directory": downloads, "download.prompt_for_download": False,
        "download.directory_upgrade": True, "safebrowsing.enabled": False,
        # The second download of the page (the code export) is not held for a permission.
        "profile.default_content_setting_values.automatic_downloads": 1,
        "intl.accept_languages": "en-US,en"})
    drv = webdriver.Chrome(service=ChromeService(CHROMEDRIVER,
                                                 log_path=os.path.join(work, "chromedriver.log")),
                           options=opts)
    # Headless Chrome saves downloads only where it is told to (the prefs, and this).
    try:
        drv.execute_cdp_cmd("Browser.setDownloadBehavior",
                            {"behavior": "allow", "downloadPath": downloads})
    except Exception:  # noqa: BLE001 - older Chromium: the page-level command
        drv.execute_cdp_cmd("Page.setDownloadBehavior",
                            {"behavior": "allow", "downloadPath": downloads})
    return drv


def make_sheet(path):
    """Three users and an invalid id (row 5), as the merchant-admin suites make their sheets."""
    import openpyxl
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["用户ID", "手机号", "邮箱"])
    for i, u in enumerate(USERS):
        ws.append([str(u), "1380000%04d" % i, "u%d@example.com" % i])
    ws.append(["abc", "13800009999", "bad@example.com"])
    wb.save(path + ".part")
    os.rename(path + ".part", path)


def test_setup():
    global gw, driver, work, shots_dir, downloads
    chart = os.path.join(ROOT, "deploy", "console", "node_modules", "chart.js", "dist",
                         "chart.umd.js")
    check(os.path.exists(chart), "%s is missing: npm ci --prefix deploy/console "
          "(deploy/local/deps.sh)" % chart)
    work = tempfile.mkdtemp(prefix="quan-console.", dir=TMP)
    shots_dir = os.environ.get("QUAN_CONSOLE_SCREENSHOTS") or os.path.join(work, "screenshots")
    downloads = os.path.join(work, "downloads")
    files = os.path.join(work, "files")
    for d in (shots_dir, downloads, files):
        os.makedirs(d, exist_ok=True)
    state["sheet"] = "console-users-%d.xlsx" % SHOP
    if STACK:
        files = os.path.join(STACK, ".run", "files")
    make_sheet(os.path.join(files, state["sheet"]))
    if STACK:
        for i, name in enumerate(("merchant-admin", "engine", "settlement", "distribution")):
            svcs.append(StackService(name, UP_PORT + 10 * (i + 1)))
        gw = {"dir": None, "port": UP_PORT, "url": "http://127.0.0.1:%d" % UP_PORT}
    else:
        env = {"QUAN_FILE_ROOT": files}
        for name in ("merchant-admin", "engine", "settlement", "distribution"):
            svcs.append(Service(name, env, replicas=1))
        for s in svcs:
            s.wait_ready()
        gw = start_gateway()
    # What the page will meet: endpoints other work adds to merchant-admin may not be here yet.
    state["summary_missing"] = route_missing("/coupon-template/stats/summary")
    state["history_missing"] = route_missing("/coupon/history?couponId=1")
    if state["summary_missing"]:
        expected_severe.append((r"/coupon-template/stats/summary\b.* 404",
                                "merchant-admin has no stats/summary: the console falls back"))
    if state["history_missing"]:
        expected_severe.append((r"/coupon/history\b.* 404",
                                "merchant-admin has no coupon/history: the console says so"))
    driver = start_browser()


# ---------------------------------------------------------------- the static files


def fetch_raw(path, headers=None):
    req = urllib.request.Request(gw["url"] + path, headers=headers or {})
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **kw):
        return None


def test_static_files_without_a_token():
    for path, ctype in (("/console/", "text/html"), ("/console/index.html", "text/html"),
                        ("/console/console.js", "text/javascript"),
                        ("/console/console.css", "text/css"),
                        ("/console/vendor/chart.umd.js", "text/javascript")):
        s, h, body = fetch_raw(path)
        check(s == 200 and h.get("Content-Type", "").startswith(ctype) and body,
              "%s: %s %s" % (path, s, h.get("Content-Type")))
        csp = h.get("Content-Security-Policy", "")
        check("default-src 'self'" in csp and "frame-ancestors 'none'" in csp,
              "%s: CSP %r" % (path, csp))
        check(h.get("X-Content-Type-Options") == "nosniff", "%s: %s" % (path, h))
    s, _, body = fetch_raw("/console/console.js")
    with open(os.path.join(ROOT, "deploy", "console", "console.js"), "rb") as f:
        check(body == f.read(), "console.js is deploy/console's")
    s, h, _ = fetch_raw("/console")
    check(s == 301 and h.get("Location") == "/console/", "/console: %s %s" % (s, h.get("Location")))
    s, _, body = fetch_raw("/console/no-such-file.js")
    check(s == 404 and json.loads(body)["code"] == "A000404", "missing file: %s %s" % (s, body))
    # The API behind the same gateway still wants the token.
    s, _, r = request("GET", gw["url"] + MA + "/coupon-template/page")
    check(s == 401 and r["code"] == "A000401", "no token: %s %s" % (s, r))
    s, _, _ = fetch_raw("/")
    check(s == 404, "/: %s" % s)


# ---------------------------------------------------------------- the browser


def test_login():
    driver.get(gw["url"] + "/console/")
    until(lambda: css("#page-login").is_displayed(), 10, "the login page")
    # Before logging in, the other tabs are closed.
    check(not css('#tabs button[data-tab="templates"]').is_enabled(), "templates tab enabled")
    shot("login")
    css("#token").send_keys(mint())
    css("#login-btn").click()
    until(lambda: css("#page-templates").is_displayed(), 10, "the templates page after log in")
    who = css("#who").text
    check(str(SHOP) in who and str(MERCHANT) in who, "who: %r" % who)
    check(css("#ti-shop").get_attribute("textContent") == str(SHOP), "token info")
    drain_log()


def test_create_template():
    name = "console-%x" % random.getrandbits(32)
    fill("#f-name", name)
    fill("#f-stock", 500)
    css("#tpl-create-btn").click()
    # (the list re-renders as it refreshes: the row's id is read in the same poll)
    tid = until(lambda: [r.get_attribute("data-id") for r in css_all("#tpl-table tbody tr")
                         if name in r.text], 15, "the new template in the list")[0]
    check(re.match(r"^[0-9]+$", tid or ""), "row id %r" % tid)
    until(lambda: css("#tpl-sel-id").text == tid, 5, "the new template selected")
    s, _, r = ma_api("GET", "/coupon-template/find?couponTemplateId=%s" % tid)
    check(s == 200 and r["data"]["name"] == name and r["data"]["stock"] == 500
          and r["data"]["shopNumber"] == str(SHOP), "find: %s %s" % (s, r))
    state["tpl"] = tid
    state["tpl_name"] = name
    drain_log()


def test_api_error_shown_in_the_page():
    # A time the browser's own checks let through and the API refuses.
    driver.execute_script("document.getElementById('f-end').value = '2020-01-01T00:00:00';")
    fill("#f-name", "refused-%x" % random.getrandbits(32))
    css("#tpl-create-btn").click()
    text = until(lambda: css("#error").is_displayed() and css("#error-text").text, 10,
                 "the error banner")
    check("validEndTime" in text and "[400 A000001]" in text, "banner: %r" % text)
    shot("templates-error")
    expected_severe.append((r"/coupon-template/create\b.* 400",
                            "the refused create this test provoked"))
    css("#error-close").click()
    check(not css("#error").is_displayed(), "banner closed")
    drain_log()


def test_task_progress_reaches_100():
    tab("tasks")
    check(css("#t-tpl").get_attribute("value") == state["tpl"], "task form's template: %r"
          % css("#t-tpl").get_attribute("value"))
    fill("#t-name", "console push")
    fill("#t-file", state["sheet"])
    css("#task-create-btn").click()
    until(lambda: css("#task-watch").is_displayed(), 10, "the task's progress")
    state["task"] = css("#tw-id").text
    until(lambda: css("#task-bar").get_attribute("aria-valuenow") == "100", 60,
          "the progress bar at 100 %")
    until(lambda: css("#tw-success").text == "3" and css("#tw-fail").text == "1", 10,
          "3 succeeded and 1 failed")
    check("100 %" in css("#tw-text").text, "progress text %r" % css("#tw-text").text)
    # The fill grows with a transition: full once it has run.
    until(lambda: driver.execute_script(
        "const b = document.getElementById('task-bar');"
        "return b.querySelector('.fill').getBoundingClientRect().width"
        " / b.getBoundingClientRect().width;") > 0.99, 5, "the bar drawn full")
    s, _, r = ma_api("GET", "/coupon-task/find?taskId=%s" % state["task"])
    check(s == 200 and r["data"]["status"] == 3 and r["data"]["successNum"] == 3
          and r["data"]["failNum"] == 1, "find: %s %s" % (s, r))
    until(lambda: any(state["task"] in r.text for r in css_all("#task-table tbody tr")), 5,
          "the task in the list")
    shot("tasks")
    drain_log()


def test_failure_report_downloads():
    before = set(os.listdir(downloads))
    css("#tw-report").click()
    path = downloaded(before)
    rows = xlsx_rows(path)
    check(len(rows) == 2 and rows[1][1] == "abc" and rows[1][2] == "invalid user id"
          and int(rows[1][0]) == 5, "report %s: %s" % (path, rows))
    drain_log()


def test_statistics_equal_the_api():
    tab("templates")
    row_sel = '#tpl-table tbody tr[data-id="%s"]' % state["tpl"]
    click(row_sel)
    # The page re-renders as its statistics refresh: an element read between two renders is
    # stale, so every read here is retried (until) rather than done once.
    keys = until(lambda: [e.get_attribute("data-stat") for e in css_all("[data-stat]")], 5,
                 "the statistics fields")
    check(len(keys) >= 12, "stat fields: %s" % keys)

    def same():
        s, _, r = ma_api("GET", "/coupon-template/stats?couponTemplateId=%s" % state["tpl"])
        check(s == 200, "stats: %s %s" % (s, r))
        want = {}
        for k in keys:
            v = r["data"]
            for part in k.split("."):
                v = v[part]
            want[k] = float(v)
        page = {e.get_attribute("data-stat"): e.text for e in css_all("[data-stat]")}
        try:
            have = {k: float(v) for k, v in page.items()}
        except ValueError:
            return None
        state["stats_seen"] = (have, want)
        return have == want and want["issued.distribution"] == 3 and r["data"]
    try:
        data = until(same, 15, "the page's statistics equal to the API's")
    except AssertionError as e:
        raise AssertionError("%s; last seen (page, API): %s" % (e, state.get("stats_seen")))
    check(data["stock"] == 497 and data["issued"]["total"] == 3, "stats: %s" % data)
    # The list's row: its totals too.
    cells = until(lambda: [c.text for c in css(row_sel).find_elements("css selector", "td")], 5,
                  "the template's row")
    check(cells[3] == "497" and cells[4] == "3", "row: %s" % cells)
    # The chart: Chart.js drew the hour, the distribution bars add up to the coupons issued.
    sums = until(lambda: driver.execute_script(
        "const c = window.Chart && Chart.getChart(document.getElementById('chart'));"
        "return c && c.data.labels.length >= 60 && Object.fromEntries(c.data.datasets.map("
        "d => [d.key, d.data.reduce((a, b) => a + b, 0)]));"), 10, "the chart")
    check(sums == {"claim": 0, "mq": 0, "distribution": 3, "exchangeCode": 0}, "chart: %s" % sums)
    s, _, r = ma_api("GET", "/coupon-template/stats/series?couponTemplateId=%s&grain=minute"
                     % state["tpl"])
    check(s == 200 and sum(p["distribution"] for p in r["data"]["points"]) == 3,
          "series: %s %s" % (s, r))
    shot("templates")
    drain_log()


def test_increase_stock():
    fill("#inc-number", 10)
    css('#inc-form button[type="submit"]').click()
    until(lambda: css('[data-stat="stock"]').text == "507", 10, "the stock 497 + 10 in the page")
    s, _, r = ma_api("GET", "/coupon-template/stats?couponTemplateId=%s" % state["tpl"])
    check(s == 200 and r["data"]["stock"] == 507, "stats: %s %s" % (s, r))
    drain_log()


def test_exchange_codes():
    tab("codes")
    check(css("#c-tpl").get_attribute("value") == state["tpl"], "code form's template")
    fill("#c-count", 5)
    css('#code-form button[type="submit"]').click()
    batch = until(lambda: [(r.get_attribute("data-id"), r.text)
                           for r in css_all("#code-table tbody tr")
                           if r.find_elements("css selector", "button")[0].is_enabled()], 30,
                  "the batch ready")[0]
    s, _, r = ma_api("GET", "/coupon-template/exchange-code/find?batchId=%s" % batch[0])
    check(s == 200 and r["data"]["count"] == 5 and r["data"]["status"] == 1
          and r["data"]["couponTemplateId"] == state["tpl"], "find: %s %s" % (s, r))
    check("ready" in batch[1], "batch row: %r" % batch[1])
    before = set(os.listdir(downloads))
    click('#code-table tbody tr[data-id="%s"] button' % batch[0])
    rows = xlsx_rows(downloaded(before))
    check(len(rows) == 6, "codes export: %s" % rows)
    shot("codes")
    drain_log()


def test_coupon_history():
    user = USERS[0]
    s, _, r = request("GET", svcs[1].url + "/api/engine/user-coupon/list", None,
                      {"X-User-Id": str(user)})
    check(s == 200, "wallet: %s %s" % (s, r))
    mine = [c for c in r["data"] if c["couponTemplateId"] == state["tpl"]]
    check(len(mine) == 1, "the user's coupon: %s" % r["data"])
    tab("history")
    fill("#h-coupon", mine[0]["userCouponId"])
    css('#hist-form button[type="submit"]').click()
    if state["history_missing"]:
        text = until(lambda: css("#hist-missing").is_displayed() and css("#hist-missing").text,
                     10, "the message that the endpoint is missing")
        check("404" in text, "message %r" % text)
        print("   merchant-admin has no coupon/history here: the page says %r" % text)
    else:
        until(lambda: css("#hist-table").is_displayed(), 10, "the history table")
        check(css("#hi-user").text == str(user), "user %r" % css("#hi-user").text)
        first = css_all("#hist-table tbody tr")[0].text
        check("issued" in first and "Distribution" in first, "first event %r" % first)
    shot("history")
    drain_log()


def test_language_switch():
    tab("templates")
    label = css('#tabs button[data-tab="templates"]')
    check(label.text == "Templates", "English label %r" % label.text)
    css("#lang").click()
    until(lambda: label.text == "券模板", 5, "the Chinese label")
    check(driver.execute_script("return document.documentElement.lang") == "zh-CN", "lang")
    check(css("#lang").text == "English", "toggle %r" % css("#lang").text)
    # The statuses drawn by the script follow.
    until(lambda: "生效中" in css('#tpl-table tbody tr[data-id="%s"]' % state["tpl"]).text, 5,
          "a Chinese status in the list")
    shot("templates-zh")
    css("#lang").click()
    until(lambda: label.text == "Templates", 5, "the English label again")
    drain_log()


def test_no_browser_console_errors():
    drain_log()
    severe = [e for e in browser_log if e.get("level") == "SEVERE"]
    unexpected = [e for e in severe
                  if not any(re.search(p, e.get("message", "")) for p, _ in expected_severe)]
    for e in severe:
        why = next((w for p, w in expected_severe if re.search(p, e.get("message", ""))), None)
        print("   SEVERE %s%s" % (e.get("message"), " (expected: %s)" % why if why else ""))
    check(not unexpected, "browser console errors: %s" % json.dumps(unexpected, indent=1))


def teardown():
    if driver:
        try:
            driver.quit()
        except Exception:  # noqa: BLE001
            pass
    if gw and gw["dir"]:
        subprocess.run(["bash", GATEWAY_SH, "stop", gw["dir"]], capture_output=True, timeout=60)
    for s in svcs:
        s.stop()
    print("screenshots in %s: %s" % (shots_dir, ", ".join(
        sorted(os.path.basename(p) for p in glob.glob(os.path.join(shots_dir or "", "*.png"))))))


if __name__ == "__main__":
    preflight()
    run([test_setup, test_static_files_without_a_token, test_login, test_create_template,
         test_api_error_shown_in_the_page, test_task_progress_reaches_100,
         test_failure_report_downloads, test_statistics_equal_the_api, test_increase_stock,
         test_exchange_codes,
         test_coupon_history, test_language_switch, test_no_browser_console_errors],
        teardown=teardown)
