// The merchant console: one ES module, no framework, no build step. Every call goes to the
// gateway that served this page (same origin), with the shop's token as a bearer token; the
// gateway verifies it and the services see only the identity it carries.

const API = '/api/merchant-admin';
const POLL_MS = 2000;
const TOKEN_KEY = 'quan.console.token';
const LANG_KEY = 'quan.console.lang';
const BATCHES_KEY = 'quan.console.batches';

// ------------------------------------------------------------------ labels, one object per language

const I18N = {
  en: {
    title: 'Quan merchant console',
    logout: 'Log out',
    langButton: '中文',
    'tab.login': 'Log in', 'tab.templates': 'Templates', 'tab.tasks': 'Distribution tasks',
    'tab.codes': 'Exchange codes', 'tab.history': 'Coupon history',
    'login.title': 'Log in with a shop token',
    'login.hint': 'Paste a token minted for a shop (quan-token --shop). It stays in this tab only (sessionStorage); every call goes through the gateway with it.',
    'login.token': 'Token', 'login.submit': 'Log in', 'login.shop': 'Shop', 'login.user': 'User',
    'login.name': 'Name', 'login.expires': 'Expires',
    'login.ok': 'Logged in as shop {shop}.',
    'login.notToken': 'This is not a token (three base64url parts, a JSON payload).',
    'login.noShop': 'This token carries no shop: mint one with quan-token --shop.',
    'login.expired': 'This token expired at {time}.',
    who: 'shop {shop} · user {user}',
    'tpl.title': 'Coupon templates', 'tpl.id': 'ID', 'tpl.name': 'Name', 'tpl.status': 'Status',
    'tpl.selected': 'Selected template', 'tpl.increase': 'Add stock', 'tpl.increaseBtn': 'Add',
    'tpl.terminate': 'Terminate', 'tpl.create': 'Create a template', 'tpl.createBtn': 'Create',
    'tpl.created': 'Template {id} created.', 'tpl.increased': 'Stock of {id} raised by {n}.',
    'tpl.terminated': 'Template {id} terminated.',
    'tpl.confirmTerminate': 'Terminate template {id}? No coupon of it can be claimed afterwards.',
    'tpl.fromSummary': 'Listed with their totals by coupon-template/stats/summary; refreshed every 2 seconds.',
    'tpl.fromPage': 'This server has no coupon-template/stats/summary (404 route not found): listed by coupon-template/page, each row\'s totals from coupon-template/stats; refreshed every 2 seconds.',
    'tpl.none': 'No template yet: create one below.',
    'tpl.status.0': 'active', 'tpl.status.1': 'ended',
    'st.stock': 'Stock', 'st.issued': 'Issued', 'st.used': 'Used', 'st.refunded': 'Refunded',
    'st.expired': 'Expired', 'st.discount': 'Discount', 'st.netDiscount': 'Net discount',
    'st.users': 'Users', 'st.updated': 'Updated',
    'ch.claim': 'Claims', 'ch.mq': 'Queued claims', 'ch.distribution': 'Distribution',
    'ch.exchangeCode': 'Exchange codes', 'ch.other': 'Other', 'ch.unknown': 'Unknown',
    'chart.title': 'Coupons issued per minute, last hour',
    'chart.zone': 'Times in the server\'s zone (QUAN_TIMEZONE)',
    'chart.missing': 'Chart.js did not load (run npm ci --prefix deploy/console): no chart.',
    'chart.badZone': 'Unknown time zone.',
    'f.name': 'Name', 'f.type': 'Type', 'f.source': 'Source', 'f.target': 'Applies to',
    'f.goods': 'Goods', 'f.start': 'Valid from', 'f.end': 'Valid until', 'f.stock': 'Stock',
    'f.limit': 'Per person', 'f.terms': 'Threshold (yuan)', 'f.max': 'Amount off / cap (yuan)',
    'f.rate': 'Rate paid (type 2)', 'f.period': 'Valid for (hours)',
    'type.0': 'Amount off', 'type.1': 'Amount off above a threshold', 'type.2': 'Percent off',
    'source.0': 'Shop', 'source.1': 'Platform', 'target.1': 'The whole shop', 'target.0': 'Some goods',
    'task.title': 'Distribution tasks', 'task.create': 'Push coupons to the users of a sheet',
    'task.fileHint': 'The sheet (.xlsx or .csv: user id, phone, mail) is named, not uploaded: a path under the file root of merchant-admin and distribution (QUAN_FILE_ROOT; .run/files/ under make up), or an http(s) URL.',
    'task.name': 'Task name', 'task.file': 'Sheet', 'task.template': 'Template ID',
    'task.notify': 'Notify by', 'task.when': 'When', 'task.now': 'Now', 'task.scheduled': 'At a time',
    'task.sendTime': 'Send at', 'task.createBtn': 'Start', 'task.progress': 'Progress of task',
    'task.success': 'Succeeded', 'task.fail': 'Failed', 'task.report': 'Download the failure report',
    'task.cancel': 'Cancel', 'task.list': 'Tasks', 'task.id': 'ID', 'task.rows': 'Rows',
    'task.created': 'Created', 'task.started': 'Task {id} created.',
    'task.cancelled': 'Cancel of task {id} requested.',
    'task.counting': 'rows not counted yet', 'task.rowsOf': '{done} of {all} rows ({pct} %)',
    'task.downloaded': 'Downloaded {file}.',
    'task.status.0': 'pending', 'task.status.1': 'running', 'task.status.2': 'failed',
    'task.status.3': 'succeeded', 'task.status.4': 'cancelled',
    'notify.0': 'In-app', 'notify.1': 'Popup', 'notify.2': 'E-mail', 'notify.3': 'SMS',
    'code.title': 'Exchange codes', 'code.count': 'Codes', 'code.createBtn': 'Generate',
    'code.batch': 'Batch ID', 'code.generated': 'Generated', 'code.export': 'Export',
    'code.hint': 'Batches created or found in this tab; their state is refreshed every 2 seconds.',
    'code.created': 'Batch {id} is being generated.',
    'code.status.0': 'generating', 'code.status.1': 'ready', 'code.status.2': 'failed',
    'hist.title': 'A coupon\'s history', 'hist.coupon': 'Coupon ID', 'hist.event': 'Event',
    'hist.detail': 'Channel / change', 'hist.ref': 'Reference', 'hist.actor': 'By', 'hist.time': 'Time',
    'hist.missing': 'This server has no coupon/history endpoint yet (404 route not found).',
    'ev.issued': 'issued', 'ev.locked': 'locked', 'ev.unlocked': 'unlocked', 'ev.paid': 'paid',
    'ev.refunded': 'refunded', 'ev.expired': 'expired', 'ev.revoked': 'revoked', 'ev.changed': 'changed',
    prev: 'Previous', next: 'Next', find: 'Find', pageInfo: 'page {current} of {pages} ({total})',
    'err.network': 'The gateway did not answer: {msg}',
    'err.notJson': 'The gateway answered {status} without the JSON envelope.',
    'err.status': 'The gateway answered {status}.',
    'err.login': 'Log in first (a shop token).',
    'err.script': 'The page failed: {msg}',
    'err.requestId': 'request {id}',
  },
  zh: {
    title: 'Quan 商家控制台',
    logout: '退出',
    langButton: 'English',
    'tab.login': '登录', 'tab.templates': '券模板', 'tab.tasks': '分发任务',
    'tab.codes': '兑换码', 'tab.history': '优惠券记录',
    'login.title': '用店铺令牌登录',
    'login.hint': '粘贴为店铺签发的令牌（quan-token --shop）。令牌只保存在本标签页（sessionStorage），每次调用都经网关携带它。',
    'login.token': '令牌', 'login.submit': '登录', 'login.shop': '店铺', 'login.user': '用户',
    'login.name': '名称', 'login.expires': '过期时间',
    'login.ok': '已登录店铺 {shop}。',
    'login.notToken': '这不是令牌（应为三段 base64url，载荷为 JSON）。',
    'login.noShop': '该令牌不含店铺：请用 quan-token --shop 签发。',
    'login.expired': '该令牌已于 {time} 过期。',
    who: '店铺 {shop} · 用户 {user}',
    'tpl.title': '优惠券模板', 'tpl.id': 'ID', 'tpl.name': '名称', 'tpl.status': '状态',
    'tpl.selected': '当前模板', 'tpl.increase': '增加库存', 'tpl.increaseBtn': '增加',
    'tpl.terminate': '结束', 'tpl.create': '创建模板', 'tpl.createBtn': '创建',
    'tpl.created': '模板 {id} 已创建。', 'tpl.increased': '模板 {id} 库存增加 {n}。',
    'tpl.terminated': '模板 {id} 已结束。',
    'tpl.confirmTerminate': '结束模板 {id}？之后不能再领取它的券。',
    'tpl.fromSummary': '由 coupon-template/stats/summary 列出并附统计，每 2 秒刷新。',
    'tpl.fromPage': '此服务器没有 coupon-template/stats/summary（404 路由不存在）：由 coupon-template/page 列出，每行统计来自 coupon-template/stats，每 2 秒刷新。',
    'tpl.none': '还没有模板：在下面创建一个。',
    'tpl.status.0': '生效中', 'tpl.status.1': '已结束',
    'st.stock': '库存', 'st.issued': '已发放', 'st.used': '已核销', 'st.refunded': '已退回',
    'st.expired': '已过期', 'st.discount': '优惠金额', 'st.netDiscount': '净优惠金额',
    'st.users': '用户数', 'st.updated': '更新于',
    'ch.claim': '领取', 'ch.mq': '排队领取', 'ch.distribution': '分发', 'ch.exchangeCode': '兑换码',
    'ch.other': '其他', 'ch.unknown': '未知',
    'chart.title': '最近一小时每分钟发放的券',
    'chart.zone': '时间为服务器时区（QUAN_TIMEZONE）',
    'chart.missing': 'Chart.js 未加载（请运行 npm ci --prefix deploy/console）：无图表。',
    'chart.badZone': '未知时区。',
    'f.name': '名称', 'f.type': '类型', 'f.source': '来源', 'f.target': '适用范围',
    'f.goods': '商品', 'f.start': '生效时间', 'f.end': '截止时间', 'f.stock': '库存',
    'f.limit': '每人限领', 'f.terms': '门槛（元）', 'f.max': '减免金额 / 上限（元）',
    'f.rate': '支付比例（类型 2）', 'f.period': '有效期（小时）',
    'type.0': '立减', 'type.1': '满减', 'type.2': '折扣',
    'source.0': '店铺券', 'source.1': '平台券', 'target.1': '全店通用', 'target.0': '指定商品',
    'task.title': '分发任务', 'task.create': '向表格中的用户发券',
    'task.fileHint': '表格（.xlsx 或 .csv：用户ID、手机号、邮箱）按名称指定而非上传：merchant-admin 与 distribution 文件根目录（QUAN_FILE_ROOT；make up 下为 .run/files/）下的路径，或 http(s) 地址。',
    'task.name': '任务名称', 'task.file': '表格', 'task.template': '模板 ID',
    'task.notify': '通知方式', 'task.when': '发送时间', 'task.now': '立即', 'task.scheduled': '定时',
    'task.sendTime': '定时时间', 'task.createBtn': '开始', 'task.progress': '任务进度',
    'task.success': '成功', 'task.fail': '失败', 'task.report': '下载失败明细',
    'task.cancel': '取消', 'task.list': '任务列表', 'task.id': 'ID', 'task.rows': '行数',
    'task.created': '创建时间', 'task.started': '任务 {id} 已创建。',
    'task.cancelled': '已请求取消任务 {id}。',
    'task.counting': '行数尚未统计', 'task.rowsOf': '{done} / {all} 行（{pct} %）',
    'task.downloaded': '已下载 {file}。',
    'task.status.0': '待执行', 'task.status.1': '执行中', 'task.status.2': '失败',
    'task.status.3': '成功', 'task.status.4': '已取消',
    'notify.0': '站内信', 'notify.1': '弹窗', 'notify.2': '邮件', 'notify.3': '短信',
    'code.title': '兑换码', 'code.count': '数量', 'code.createBtn': '生成',
    'code.batch': '批次 ID', 'code.generated': '已生成', 'code.export': '导出',
    'code.hint': '本标签页中创建或查询过的批次，每 2 秒刷新状态。',
    'code.created': '批次 {id} 正在生成。',
    'code.status.0': '生成中', 'code.status.1': '就绪', 'code.status.2': '失败',
    'hist.title': '优惠券记录', 'hist.coupon': '优惠券 ID', 'hist.event': '事件',
    'hist.detail': '渠道 / 变化', 'hist.ref': '关联', 'hist.actor': '操作方', 'hist.time': '时间',
    'hist.missing': '此服务器尚无 coupon/history 接口（404 路由不存在）。',
    'ev.issued': '发放', 'ev.locked': '锁定', 'ev.unlocked': '解锁', 'ev.paid': '核销',
    'ev.refunded': '退回', 'ev.expired': '过期', 'ev.revoked': '撤销', 'ev.changed': '变更',
    prev: '上一页', next: '下一页', find: '查询', pageInfo: '第 {current} / {pages} 页（共 {total}）',
    'err.network': '网关无响应：{msg}',
    'err.notJson': '网关返回 {status}，不是 JSON 信封。',
    'err.status': '网关返回 {status}。',
    'err.login': '请先登录（店铺令牌）。',
    'err.script': '页面出错：{msg}',
    'err.requestId': '请求 {id}',
  },
};

let lang = I18N[localStorage.getItem(LANG_KEY)] ? localStorage.getItem(LANG_KEY)
  : ((navigator.language || '').toLowerCase().startsWith('zh') ? 'zh' : 'en');

function t(key, params) {
  let s = I18N[lang][key] ?? I18N.en[key] ?? key;
  for (const [k, v] of Object.entries(params || {})) s = s.split('{' + k + '}').join(String(v));
  return s;
}

function applyLang() {
  document.documentElement.lang = lang === 'zh' ? 'zh-CN' : 'en';
  document.title = t('title');
  for (const el of document.querySelectorAll('[data-i18n]')) el.textContent = t(el.dataset.i18n);
  $('#lang').textContent = t('langButton');
  renderWho();
  // The tables hold translated words (statuses, events): drawn again.
  renderTemplates();
  renderSelected();
  renderTasks();
  renderWatch();
  renderBatches();
  renderHistory();
  if (chart) {
    chart.data.datasets.forEach((d) => { d.label = t('ch.' + d.key); });
    chart.update('none');
  }
}

// ------------------------------------------------------------------ small helpers

const $ = (sel) => document.querySelector(sel);

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === 'class') e.className = v;
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ''));
  return e;
}

function num(v) {
  return v === null || v === undefined ? '–' : String(v);
}

function get(obj, path) {
  return path.split('.').reduce((o, k) => (o == null ? undefined : o[k]), obj);
}

// An input of type datetime-local as RFC 3339 in UTC (the browser's zone is the one the user
// typed in; the API takes any offset).
function localToIso(value) {
  if (!value) return undefined;
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? value : d.toISOString().slice(0, 19) + 'Z';
}

function toLocalInput(date) {
  const p = (n) => String(n).padStart(2, '0');
  return `${date.getFullYear()}-${p(date.getMonth() + 1)}-${p(date.getDate())}T${p(date.getHours())}:${p(date.getMinutes())}:${p(date.getSeconds())}`;
}

// ------------------------------------------------------------------ errors and notices

class ApiError extends Error {
  constructor(status, code, message, requestId) {
    super(message);
    this.status = status;
    this.code = code;
    this.requestId = requestId;
  }

  // A 404 for the path itself (the service's or the gateway's), not for a resource.
  get routeMissing() {
    return this.status === 404 && /^no such path/.test(this.message || '');
  }
}

function showError(err) {
  let text = err instanceof Error ? err.message : String(err);
  if (err instanceof ApiError && err.code) text = `${text} [${err.status} ${err.code}]`;
  if (err instanceof ApiError && err.requestId) text += ' · ' + t('err.requestId', { id: err.requestId });
  $('#error-text').textContent = text;
  $('#error').hidden = false;
}

function clearError() {
  $('#error').hidden = true;
  $('#error-text').textContent = '';
}

let noticeTimer = null;
function notice(text) {
  const n = $('#notice');
  n.textContent = text;
  n.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => { n.hidden = true; }, 6000);
}

// Whatever escapes a handler is shown, never a blank page and never a silent failure.
window.addEventListener('error', (e) => showError(t('err.script', { msg: e.message })));
window.addEventListener('unhandledrejection', (e) => {
  e.preventDefault();
  showError(e.reason instanceof Error ? e.reason : t('err.script', { msg: String(e.reason) }));
});

// A handler for a button or form: runs fn, shows its error, keeps the control disabled meanwhile.
function action(fn) {
  return async (ev) => {
    if (ev && ev.type === 'submit') ev.preventDefault();
    const ctl = ev && (ev.submitter || (ev.currentTarget instanceof HTMLButtonElement ? ev.currentTarget : null));
    if (ctl) ctl.disabled = true;
    try {
      clearError();
      await fn(ev);
    } catch (err) {
      showError(err);
    } finally {
      if (ctl) ctl.disabled = false;
    }
  };
}

// ------------------------------------------------------------------ the API through the gateway

const session = { token: sessionStorage.getItem(TOKEN_KEY) || '', claims: null };

async function api(method, path, { query, body, download } = {}) {
  if (!session.token) throw new Error(t('err.login'));
  const url = new URL(API + path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== '') url.searchParams.set(k, v);
  }
  const headers = { Authorization: 'Bearer ' + session.token };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(url, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store',
    });
  } catch (err) {
    throw new ApiError(0, '', t('err.network', { msg: err.message }));
  }
  const type = res.headers.get('Content-Type') || '';
  if (download && res.ok && !type.includes('application/json')) {
    const disp = res.headers.get('Content-Disposition') || '';
    const m = /filename="?([^";]+)"?/.exec(disp);
    return { blob: await res.blob(), filename: m ? m[1] : download };
  }
  let env = null;
  try {
    env = await res.json();
  } catch {
    env = null;
  }
  if (!env || typeof env !== 'object' || !('success' in env)) {
    throw new ApiError(res.status, '', t('err.notJson', { status: res.status }));
  }
  if (!res.ok || env.success !== true) {
    if (res.status === 401) onUnauthorized();
    throw new ApiError(res.status, env.code, env.message || t('err.status', { status: res.status }),
      env.requestId);
  }
  return env.data;
}

function saveBlob({ blob, filename }) {
  const a = el('a', { href: URL.createObjectURL(blob), download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60000);
  notice(t('task.downloaded', { file: filename }));
}

// ------------------------------------------------------------------ log in

function decodeClaims(token) {
  const parts = token.split('.');
  if (parts.length !== 3) return null;
  try {
    const b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/');
    const bytes = Uint8Array.from(atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4)), (c) => c.charCodeAt(0));
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    return claims && typeof claims === 'object' ? claims : null;
  } catch {
    return null;
  }
}

function renderWho() {
  const c = session.claims;
  $('#who').textContent = c ? t('who', { shop: c.shop, user: c.sub }) + (c.name ? ' · ' + c.name : '') : '';
  $('#logout').hidden = !c;
  for (const b of document.querySelectorAll('#tabs button')) {
    if (b.dataset.tab !== 'login') b.disabled = !c;
  }
  const info = $('#token-info');
  info.hidden = !c;
  if (c) {
    $('#ti-shop').textContent = c.shop;
    $('#ti-user').textContent = c.sub;
    $('#ti-name').textContent = c.name || '–';
    $('#ti-exp').textContent = c.exp ? new Date(c.exp * 1000).toLocaleString() : '–';
  }
}

function setToken(token) {
  const claims = decodeClaims(token);
  if (!claims) throw new Error(t('login.notToken'));
  if (!claims.shop) throw new Error(t('login.noShop'));
  if (typeof claims.exp === 'number' && claims.exp * 1000 < Date.now()) {
    throw new Error(t('login.expired', { time: new Date(claims.exp * 1000).toLocaleString() }));
  }
  session.token = token;
  session.claims = claims;
  sessionStorage.setItem(TOKEN_KEY, token);
}

function logout() {
  session.token = '';
  session.claims = null;
  sessionStorage.removeItem(TOKEN_KEY);
  tpl.records = [];
  tpl.selected = null;
  tpl.stats = null;
  tasks.records = [];
  tasks.watch = null;
  batches.clear();
  keepBatches();
  hist.data = null;
  $('#token').value = '';
  renderWho();
  showTab('login');
}

// The gateway refused the token (expired, another key): back to the log-in page, the message
// stays shown.
function onUnauthorized() {
  session.token = '';
  session.claims = null;
  sessionStorage.removeItem(TOKEN_KEY);
  renderWho();
  showTab('login');
}

$('#login-form').addEventListener('submit', action(async () => {
  setToken($('#token').value.trim());
  renderWho();
  // One call through the gateway: the token is checked where it matters (a 401 logs out).
  await api('GET', '/coupon-template/page', { query: { current: 1, size: 1 } });
  notice(t('login.ok', { shop: session.claims.shop }));
  showTab('templates');
}));
$('#logout').addEventListener('click', logout);

// ------------------------------------------------------------------ tabs and the poll

let activeTab = 'login';

function showTab(name) {
  if (name !== 'login' && !session.claims) name = 'login';
  activeTab = name;
  for (const b of document.querySelectorAll('#tabs button')) {
    b.setAttribute('aria-selected', String(b.dataset.tab === name));
  }
  for (const s of document.querySelectorAll('main section')) s.hidden = s.dataset.page !== name;
  location.hash = name;
  poll();
}

for (const b of document.querySelectorAll('#tabs button')) {
  b.addEventListener('click', () => showTab(b.dataset.tab));
}

let polling = false;
// What the open tab shows, asked again: every POLL_MS, and at once on a tab change. One round
// at a time; an error is shown and the next round tries again.
async function poll() {
  if (polling || !session.claims) return;
  polling = true;
  try {
    if (activeTab === 'templates') {
      await loadTemplates();
      await loadSelected();
    } else if (activeTab === 'tasks') {
      await loadTasks();
      await loadWatch();
    } else if (activeTab === 'codes') {
      await loadBatches();
    }
  } catch (err) {
    showError(err);
  } finally {
    polling = false;
  }
}
setInterval(poll, POLL_MS);

// ------------------------------------------------------------------ templates

const tpl = { current: 1, size: 10, total: 0, pages: 1, records: [], summary: null, selected: null, stats: null, statsAt: null };

// A template row with its totals, from a summary record or a page record and its stats.
function templateRow(r, stats) {
  const s = stats || r;
  const issued = s.issued && typeof s.issued === 'object' ? s.issued.total : (s.issuedTotal ?? s.issued);
  return {
    id: String(r.couponTemplateId ?? r.id), name: r.name, status: r.status,
    stock: s.stock ?? r.stock, issued, used: s.used, refunded: s.refunded, expired: s.expired,
    discountAmount: s.discountAmount,
  };
}

async function loadTemplates() {
  const query = { current: tpl.current, size: tpl.size };
  let page = null;
  if (tpl.summary !== false) {
    try {
      page = await api('GET', '/coupon-template/stats/summary', { query });
      tpl.summary = true;
      tpl.records = (page.records || []).map((r) => templateRow(r));
    } catch (err) {
      if (!(err instanceof ApiError && err.routeMissing)) throw err;
      tpl.summary = false;
    }
  }
  if (tpl.summary === false) {
    page = await api('GET', '/coupon-template/page', { query });
    const stats = await Promise.all((page.records || []).map((r) =>
      api('GET', '/coupon-template/stats', { query: { couponTemplateId: r.id } }).catch(() => null)));
    tpl.records = (page.records || []).map((r, i) => templateRow(r, stats[i]));
  }
  tpl.total = page.total ?? tpl.records.length;
  tpl.pages = Math.max(1, page.pages ?? Math.ceil(tpl.total / tpl.size));
  if (!tpl.selected && tpl.records.length) selectTemplate(tpl.records[0]);
  renderTemplates();
}

function renderTemplates() {
  $('#tpl-source').textContent = tpl.summary === null ? '' : t(tpl.summary ? 'tpl.fromSummary' : 'tpl.fromPage');
  const body = $('#tpl-table tbody');
  body.replaceChildren(...tpl.records.map((r) => {
    const tr = el('tr', {
      class: 'clickable' + (tpl.selected && tpl.selected.id === r.id ? ' selected' : ''),
      dataset: { id: r.id },
      onclick: () => { selectTemplate(r); renderTemplates(); poll(); },
    },
    el('td', {}, r.id), el('td', {}, r.name),
    el('td', {}, r.status === undefined ? '–' : t('tpl.status.' + r.status)),
    el('td', { class: 'num' }, num(r.stock)), el('td', { class: 'num' }, num(r.issued)),
    el('td', { class: 'num' }, num(r.used)), el('td', { class: 'num' }, num(r.refunded)),
    el('td', { class: 'num' }, num(r.expired)), el('td', { class: 'num' }, num(r.discountAmount)));
    return tr;
  }));
  if (!tpl.records.length && tpl.summary !== null) {
    body.append(el('tr', {}, el('td', { colSpan: 9, class: 'hint' }, t('tpl.none'))));
  }
  $('#tpl-pageinfo').textContent = t('pageInfo', { current: tpl.current, pages: tpl.pages, total: tpl.total });
  $('#tpl-prev').disabled = tpl.current <= 1;
  $('#tpl-next').disabled = tpl.current >= tpl.pages;
}

// The template the statistics, the chart and the stock buttons are about; the task and code
// forms start from it.
function selectTemplate(r) {
  if (!tpl.selected || tpl.selected.id !== r.id) tpl.stats = null;
  tpl.selected = { id: String(r.id), name: r.name };
  $('#t-tpl').value = $('#c-tpl').value = tpl.selected.id;
}

$('#tpl-prev').addEventListener('click', () => { tpl.current = Math.max(1, tpl.current - 1); poll(); });
$('#tpl-next').addEventListener('click', () => { tpl.current += 1; poll(); });

async function loadSelected() {
  if (!tpl.selected) {
    renderSelected();
    return;
  }
  const id = tpl.selected.id;
  const to = new Date();
  const from = new Date(to.getTime() - 3600 * 1000);
  const [stats, series] = await Promise.all([
    api('GET', '/coupon-template/stats', { query: { couponTemplateId: id } }),
    api('GET', '/coupon-template/stats/series', {
      query: { couponTemplateId: id, grain: 'minute', from: from.toISOString().slice(0, 19) + 'Z', to: to.toISOString().slice(0, 19) + 'Z' },
    }),
  ]);
  if (!tpl.selected || tpl.selected.id !== id) return; // another one was chosen meanwhile
  tpl.stats = stats;
  tpl.statsAt = new Date();
  renderSelected();
  drawChart(series.points || [], from, to);
}

function renderSelected() {
  $('#tpl-detail').hidden = !tpl.selected;
  if (!tpl.selected) return;
  $('#tpl-sel-name').textContent = tpl.selected.name ?? '';
  $('#tpl-sel-id').textContent = tpl.selected.id;
  for (const b of document.querySelectorAll('[data-stat]')) {
    b.textContent = tpl.stats ? num(get(tpl.stats, b.dataset.stat)) : '–';
  }
  $('#st-updated').textContent = tpl.statsAt ? tpl.statsAt.toLocaleTimeString() : '–';
}

// ------------------------------------------------------------------ the chart (Chart.js)

const CHANNELS = [
  { key: 'claim', color: '#1f6feb' },
  { key: 'mq', color: '#8250df' },
  { key: 'distribution', color: '#1a7f37' },
  { key: 'exchangeCode', color: '#bf8700' },
];
let chart = null;

// "yyyy-MM-dd HH:mm" of a moment in a zone, the form of the series' times.
function minuteIn(zone, date) {
  const parts = new Intl.DateTimeFormat('en-CA', {
    timeZone: zone, year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', hourCycle: 'h23',
  }).formatToParts(date);
  const p = Object.fromEntries(parts.map((x) => [x.type, x.value]));
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}`;
}

// Every minute of the hour, those without coupons at zero. The series answers only the minutes
// with data, in the server's zone: the labels are made in that zone (the field beside the
// chart, QUAN_TIMEZONE's default), and a point outside them is still shown, in order.
function drawChart(points, from, to) {
  if (typeof window.Chart !== 'function') {
    $('#chart-note').textContent = t('chart.missing');
    return;
  }
  const zone = $('#chart-zone').value.trim() || 'Asia/Shanghai';
  const byMinute = new Map(points.map((p) => [String(p.time).slice(0, 16), p]));
  const labels = new Set();
  try {
    for (let m = Math.floor(from.getTime() / 60000) + 1; m <= Math.floor(to.getTime() / 60000); m++) {
      labels.add(minuteIn(zone, new Date(m * 60000)));
    }
    $('#chart-note').textContent = '';
  } catch {
    $('#chart-note').textContent = t('chart.badZone');
  }
  for (const k of byMinute.keys()) labels.add(k);
  const keys = [...labels].sort();
  const data = {
    labels: keys.map((k) => k.slice(11)),
    datasets: CHANNELS.map((c) => ({
      key: c.key, label: t('ch.' + c.key), backgroundColor: c.color, borderColor: c.color,
      data: keys.map((k) => Number((byMinute.get(k) || {})[c.key] || 0)),
    })),
  };
  if (!chart) {
    chart = new window.Chart($('#chart'), {
      type: 'bar',
      data,
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        scales: { x: { stacked: true, ticks: { maxTicksLimit: 13 } }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } },
        plugins: { legend: { position: 'bottom' } },
      },
    });
  } else {
    chart.data = data;
    chart.update('none');
  }
}

// ------------------------------------------------------------------ template actions

(function initTemplateForm() {
  const now = new Date();
  $('#f-start').value = toLocalInput(new Date(now.getTime() - 60000));
  $('#f-end').value = toLocalInput(new Date(now.getTime() + 30 * 86400 * 1000));
})();

$('#tpl-form').addEventListener('submit', action(async () => {
  const type = Number($('#f-type').value);
  const target = Number($('#f-target').value);
  const consumeRule = {
    maximumDiscountAmount: $('#f-max').value,
    validityPeriod: Number($('#f-period').value),
  };
  if (type !== 0) consumeRule.termsOfUse = $('#f-terms').value;
  if (type === 2) consumeRule.discountRate = $('#f-rate').value;
  const body = {
    name: $('#f-name').value, source: Number($('#f-source').value), target, type,
    validStartTime: localToIso($('#f-start').value), validEndTime: localToIso($('#f-end').value),
    stock: Number($('#f-stock').value),
    receiveRule: { limitPerPerson: Number($('#f-limit').value) },
    consumeRule,
  };
  if (target === 0) body.goods = $('#f-goods').value;
  const data = await api('POST', '/coupon-template/create', { body });
  notice(t('tpl.created', { id: data.id }));
  selectTemplate({ id: data.id, name: body.name });
  tpl.current = 1;
  await poll();
}));

$('#inc-form').addEventListener('submit', action(async () => {
  const n = Number($('#inc-number').value);
  const id = tpl.selected.id;
  await api('POST', '/coupon-template/increase-number', { body: { couponTemplateId: id, number: n } });
  notice(t('tpl.increased', { id, n }));
  await poll();
}));

$('#terminate-btn').addEventListener('click', action(async () => {
  const id = tpl.selected.id;
  if (!window.confirm(t('tpl.confirmTerminate', { id }))) return;
  await api('POST', '/coupon-template/terminate', { body: { couponTemplateId: id } });
  notice(t('tpl.terminated', { id }));
  await poll();
}));

// ------------------------------------------------------------------ distribution tasks

const tasks = { current: 1, size: 10, total: 0, pages: 1, records: [], watch: null };

async function loadTasks() {
  const page = await api('GET', '/coupon-task/page', { query: { current: tasks.current, size: tasks.size } });
  tasks.records = page.records || [];
  tasks.total = page.total ?? tasks.records.length;
  tasks.pages = Math.max(1, page.pages ?? Math.ceil(tasks.total / tasks.size));
  renderTasks();
}

function renderTasks() {
  $('#task-table tbody').replaceChildren(...tasks.records.map((r) => el('tr', {
    class: 'clickable' + (tasks.watch && String(tasks.watch.id) === String(r.id) ? ' selected' : ''),
    dataset: { id: r.id },
    onclick: () => { tasks.watch = r; renderTasks(); renderWatch(); poll(); },
  },
  el('td', {}, r.id), el('td', {}, r.taskName), el('td', {}, r.couponTemplateId),
  el('td', {}, t('task.status.' + r.status)), el('td', { class: 'num' }, num(r.sendNum)),
  el('td', { class: 'num' }, num(r.successNum)), el('td', { class: 'num' }, num(r.failNum)),
  el('td', {}, r.createTime ?? ''))));
  $('#task-pageinfo').textContent = t('pageInfo', { current: tasks.current, pages: tasks.pages, total: tasks.total });
  $('#task-prev').disabled = tasks.current <= 1;
  $('#task-next').disabled = tasks.current >= tasks.pages;
}

$('#task-prev').addEventListener('click', () => { tasks.current = Math.max(1, tasks.current - 1); poll(); });
$('#task-next').addEventListener('click', () => { tasks.current += 1; poll(); });

async function loadWatch() {
  if (!tasks.watch) return;
  const id = tasks.watch.id;
  const task = await api('GET', '/coupon-task/find', { query: { taskId: id } });
  if (tasks.watch && String(tasks.watch.id) === String(id)) tasks.watch = task;
  renderWatch();
}

// processedRows of sendNum; sendNum is counted in the background after create (null until then)
// and exact once the task succeeded.
function renderWatch() {
  const w = tasks.watch;
  $('#task-watch').hidden = !w;
  if (!w) return;
  const done = Number(w.processedRows || 0);
  const all = w.sendNum === null || w.sendNum === undefined ? null : Number(w.sendNum);
  let pct = 0;
  if (all !== null) pct = all === 0 ? (w.status === 3 ? 100 : 0) : Math.min(100, Math.floor((done * 100) / all));
  $('#tw-id').textContent = w.id;
  $('#tw-name').textContent = w.taskName ?? '';
  $('#tw-status').textContent = t('task.status.' + w.status);
  const bar = $('#task-bar');
  bar.setAttribute('aria-valuenow', String(pct));
  bar.classList.toggle('done', pct === 100);
  bar.querySelector('.fill').style.width = pct + '%';
  $('#tw-text').textContent = all === null ? t('task.counting') : t('task.rowsOf', { done, all, pct });
  $('#tw-success').textContent = num(w.successNum);
  $('#tw-fail').textContent = num(w.failNum);
  $('#tw-reason').textContent = w.failReason || '';
  $('#tw-cancel').hidden = !(w.status === 0 || w.status === 1);
}

$('#task-form').addEventListener('submit', action(async () => {
  const notify = [...document.querySelectorAll('input[name="notify"]:checked')].map((c) => c.value).join(',');
  const sendType = Number($('#t-sendtype').value);
  const body = {
    taskName: $('#t-name').value, fileAddress: $('#t-file').value.trim(), notifyType: notify,
    couponTemplateId: $('#t-tpl').value.trim(), sendType,
  };
  if (sendType === 1) body.sendTime = localToIso($('#t-sendtime').value);
  const data = await api('POST', '/coupon-task/create', { body });
  notice(t('task.started', { id: data.id }));
  tasks.watch = { id: data.id, taskName: body.taskName, status: sendType === 1 ? 0 : 1, processedRows: 0, sendNum: null };
  tasks.current = 1;
  renderWatch();
  await poll();
}));

$('#tw-report').addEventListener('click', action(async () => {
  const id = tasks.watch.id;
  saveBlob(await api('GET', '/coupon-task/fail-report', { query: { taskId: id }, download: `fail-report-${id}.xlsx` }));
}));

$('#tw-cancel').addEventListener('click', action(async () => {
  const id = tasks.watch.id;
  await api('POST', '/coupon-task/cancel', { body: { taskId: id } });
  notice(t('task.cancelled', { id }));
  await poll();
}));

// ------------------------------------------------------------------ exchange codes

// There is no list of batches in the API: the ones this tab created or looked up.
const batches = new Map((JSON.parse(sessionStorage.getItem(BATCHES_KEY) || '[]')).map((id) => [id, null]));

function keepBatches() {
  sessionStorage.setItem(BATCHES_KEY, JSON.stringify([...batches.keys()]));
}

async function loadBatches() {
  const ids = [...batches.keys()];
  const found = await Promise.all(ids.map((id) =>
    api('GET', '/coupon-template/exchange-code/find', { query: { batchId: id } })));
  ids.forEach((id, i) => batches.set(id, found[i]));
  renderBatches();
}

function renderBatches() {
  $('#code-table tbody').replaceChildren(...[...batches.entries()].reverse().map(([id, b]) => el('tr', { dataset: { id } },
    el('td', {}, id), el('td', {}, b ? b.couponTemplateId : ''), el('td', { class: 'num' }, num(b && b.count)),
    el('td', { class: 'num' }, num(b && b.generated)), el('td', {}, b ? t('code.status.' + b.status) : ''),
    el('td', {}, b ? b.createTime ?? '' : ''),
    el('td', {}, el('button', {
      type: 'button', textContent: t('code.export'), disabled: !b || b.status !== 1,
      onclick: action(async () => {
        saveBlob(await api('GET', '/coupon-template/exchange-code/export', { query: { batchId: id }, download: `codes-${id}.xlsx` }));
      }),
    })))));
}

$('#code-form').addEventListener('submit', action(async () => {
  const body = { couponTemplateId: $('#c-tpl').value.trim(), count: Number($('#c-count').value) };
  const data = await api('POST', '/coupon-template/exchange-code/create', { body });
  batches.set(String(data.batchId), null);
  keepBatches();
  notice(t('code.created', { id: data.batchId }));
  await poll();
}));

$('#code-find').addEventListener('submit', action(async () => {
  const id = $('#c-batch').value.trim();
  const b = await api('GET', '/coupon-template/exchange-code/find', { query: { batchId: id } });
  batches.delete(id);
  batches.set(id, b);
  keepBatches();
  renderBatches();
}));

// ------------------------------------------------------------------ a coupon's history

const hist = { data: null, missing: false };

function renderHistory() {
  $('#hist-missing').hidden = !hist.missing;
  $('#hist-missing').textContent = hist.missing ? t('hist.missing') : '';
  const d = hist.data;
  $('#hist-info').hidden = !d;
  $('#hist-table').hidden = !d;
  if (!d) return;
  $('#hi-coupon').textContent = d.couponId;
  $('#hi-user').textContent = d.userId ?? '–';
  $('#hi-status').textContent = d.status;
  const ev = (e) => I18N[lang]['ev.' + e] || e;
  $('#hist-table tbody').replaceChildren(...(d.events || []).map((e) => el('tr', {},
    el('td', {}, ev(e.event)),
    el('td', {}, e.channel ? t('ch.' + e.channel) : (e.from || e.to ? `${e.from ?? ''} → ${e.to ?? ''}` : '')),
    el('td', {}, e.ref ?? ''), el('td', {}, e.actor ?? ''),
    el('td', { class: 'num' }, e.discountAmount === undefined || e.discountAmount === null ? '' : String(e.discountAmount)),
    el('td', {}, e.time ?? ''))));
}

$('#hist-form').addEventListener('submit', action(async () => {
  hist.data = null;
  hist.missing = false;
  try {
    hist.data = await api('GET', '/coupon/history', { query: { couponId: $('#h-coupon').value.trim() } });
  } catch (err) {
    if (!(err instanceof ApiError && err.routeMissing)) throw err;
    hist.missing = true;
  } finally {
    renderHistory();
  }
}));

// ------------------------------------------------------------------ start

$('#error-close').addEventListener('click', clearError);
$('#lang').addEventListener('click', () => {
  lang = lang === 'en' ? 'zh' : 'en';
  localStorage.setItem(LANG_KEY, lang);
  applyLang();
});

if (session.token) {
  try {
    setToken(session.token);
  } catch (err) {
    session.token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    showError(err);
  }
}
applyLang();
const wanted = location.hash.slice(1);
showTab(session.claims && document.querySelector(`[data-page="${wanted}"]`) ? wanted : (session.claims ? 'templates' : 'login'));
