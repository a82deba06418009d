/* Webhook POSTs and SMTP mails through libcurl: see notify_send.h. */
#include "notify_send.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fetch.h"

#define NOTIFY_SEND_DEFAULT_TIMEOUT_MS 10000
#define NOTIFY_SEND_WORD_BYTES         45 /* subject bytes per encoded word: 60 base64 + 12 <= 75 */

/* The password of a URL, as written and decoded: what err must never show. */
typedef struct notify_send_secrets {
    char *part[2];
} notify_send_secrets;

static void notify_send_secrets_clear(notify_send_secrets *s)
{
    for (int i = 0; i < 2; i++)
        curl_free(s->part[i]);
    memset(s, 0, sizeof(*s));
}

/* Replaces in text (NUL-terminated, in a buffer of cap bytes) every occurrence of secret by
 * "***", and cuts a tail that begins it (libcurl may have cut its own message there). */
static void notify_send_scrub(char *text, size_t cap, const char *secret)
{
    size_t n = secret ? strlen(secret) : 0, k = 0;
    char out[CURL_ERROR_SIZE * 2];

    if (!n || !cap)
        return;
    for (const char *p = text; *p && k + 4 < sizeof(out);) {
        if (strncmp(p, secret, n) == 0) {
            memcpy(out + k, "***", 3);
            k += 3;
            p += n;
        } else {
            out[k++] = *p++;
        }
    }
    out[k] = '\0';
    for (size_t len = n - 1 < k ? n - 1 : k; len >= 4; len--)
        if (strncmp(out + k - len, secret, len) == 0) {
            out[k - len] = '\0';
            break;
        }
    snprintf(text, cap, "%s", out);
}

/* Checks url (a scheme among the two given, a host, no control character) and keeps its
 * password in sec. QN_EINVAL with err set otherwise; the URL itself is never quoted. */
static qn_status notify_send_url_check(const char *url, const char *what, const char *scheme1,
                                       const char *scheme2, notify_send_secrets *sec, char *err,
                                       size_t errlen)
{
    CURLU *u = NULL;
    char *scheme = NULL, *host = NULL;
    qn_status st = QN_EINVAL;
    size_t n = url ? strlen(url) : 0;

    if (!n) {
        qn_errf(err, errlen, "%s: no URL configured", what);
        return QN_EINVAL;
    }
    if (n > NOTIFY_SEND_URL_MAX) {
        qn_errf(err, errlen, "%s: the URL is longer than %d bytes", what, NOTIFY_SEND_URL_MAX);
        return QN_EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)url[i] < 0x21 || url[i] == 0x7f) {
            qn_errf(err, errlen, "%s: the URL contains a space or a control character", what);
            return QN_EINVAL;
        }
    const char *sep = strstr(url, "://");
    if (!sep || strchr("/?#", sep[3])) { /* curl reads "http:///x" as host "x" */
        qn_errf(err, errlen, "%s: the URL is malformed", what);
        return QN_EINVAL;
    }
    if (fetch_curl_init() != QN_OK || !(u = curl_url())) {
        qn_errf(err, errlen, "%s: libcurl could not start", what);
        return QN_ERR;
    }
    if (curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !*host) {
        qn_errf(err, errlen, "%s: the URL is malformed", what);
        goto done;
    }
    if (strcmp(scheme, scheme1) != 0 && strcmp(scheme, scheme2) != 0) {
        qn_errf(err, errlen, "%s: scheme %.16s is not allowed (%s or %s only)", what, scheme,
                scheme1, scheme2);
        goto done;
    }
    /* without a password both stay NULL */
    (void)curl_url_get(u, CURLUPART_PASSWORD, &sec->part[0], 0);
    (void)curl_url_get(u, CURLUPART_PASSWORD, &sec->part[1], CURLU_URLDECODE);
    st = QN_OK;
done:
    curl_free(scheme);
    curl_free(host);
    curl_url_cleanup(u);
    return st;
}

/* How a libcurl failure classifies (notify.h). */
static qn_status notify_send_curl_status(CURLcode rc)
{
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        return QN_ETIMEDOUT;
    case CURLE_OUT_OF_MEMORY:
        return QN_ENOMEM;
    case CURLE_FAILED_INIT:
    case CURLE_ABORTED_BY_CALLBACK:
    case CURLE_READ_ERROR:
    case CURLE_WRITE_ERROR:
        return QN_ERR;
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_LOGIN_DENIED:
    case CURLE_TOO_MANY_REDIRECTS:
    case CURLE_BAD_FUNCTION_ARGUMENT:
        return QN_EINVAL;
    default: /* the network or the peer: another attempt may go through */
        return QN_EAGAIN;
    }
}

/* err = "<what>: <libcurl's message>", without the URL's password. */
static void notify_send_curl_err(char *err, size_t errlen, const char *what, CURLcode rc,
                                 char *cerr, const notify_send_secrets *sec)
{
    if (!cerr[0])
        snprintf(cerr, CURL_ERROR_SIZE, "%s", curl_easy_strerror(rc));
    for (int i = 0; i < 2; i++)
        notify_send_scrub(cerr, CURL_ERROR_SIZE, sec->part[i]);
    qn_errf(err, errlen, "%s: %s", what, cerr);
}

static CURL *notify_send_curl_new(const char *url, long timeout_ms, const char *protocols,
                                  char *cerr)
{
    CURL *curl = curl_easy_init();
    if (!curl)
        return NULL;
    if (timeout_ms <= 0)
        timeout_ms = NOTIFY_SEND_DEFAULT_TIMEOUT_MS;
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, protocols);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for name lookups */
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, cerr);
    return curl;
}

/* ---------------------------------------------------------------- webhook */

static size_t notify_send_discard(char *p, size_t size, size_t n, void *arg)
{
    (void)p;
    (void)arg;
    return size * n;
}

qn_status notify_send_webhook(const char *url, const char *json, long timeout_ms, char *err,
                              size_t errlen)
{
    notify_send_secrets sec = {0};
    CURL *curl = NULL;
    struct curl_slist *hdrs = NULL;
    char cerr[CURL_ERROR_SIZE] = "";
    long code = 0;
    qn_status st = notify_send_url_check(url, "webhook", "http", "https", &sec, err, errlen);

    if (st != QN_OK)
        goto done;
    if (!json) {
        qn_errf(err, errlen, "webhook: no body");
        st = QN_EINVAL;
        goto done;
    }
    curl = notify_send_curl_new(url, timeout_ms, "http,https", cerr);
    hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (!curl || !hdrs) {
        qn_errf(err, errlen, "webhook: out of memory");
        st = QN_ENOMEM;
        goto done;
    }
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(json));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, notify_send_discard);
    CURLcode rc = curl_easy_perform(curl);
    if (rc != CURLE_OK) {
        st = notify_send_curl_status(rc);
        notify_send_curl_err(err, errlen, "webhook", rc, cerr, &sec);
        goto done;
    }
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200 && code < 300) {
        st = QN_OK;
    } else {
        st = code >= 500 || code == 408 || code == 429 ? QN_EAGAIN : QN_EINVAL;
        qn_errf(err, errlen, "webhook: HTTP %ld", code);
    }
done:
    curl_slist_free_all(hdrs);
    if (curl)
        curl_easy_cleanup(curl);
    notify_send_secrets_clear(&sec);
    return st;
}

/* ---------------------------------------------------------------- mail */

int notify_send_address_ok(const char *a)
{
    size_t n = a ? strlen(a) : 0;
    const char *at = n ? strchr(a, '@') : NULL;

    if (n < 3 || n > NOTIFY_SEND_ADDRESS_MAX || !at || at == a || !at[1] || strchr(at + 1, '@'))
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)a[i];
        if (c < 0x21 || c > 0x7e || strchr("<>()[]\\,;:\"", c))
            return 0;
    }
    return 1;
}

qn_status notify_send_smtp_url_check(const char *value, char *err, size_t errlen)
{
    notify_send_secrets sec = {{NULL, NULL}};
    if (!value || !*value)
        return QN_OK; /* no relay: mail is not sent */
    qn_status st = notify_send_url_check(value, "smtp", "smtp", "smtps", &sec, err, errlen);
    notify_send_secrets_clear(&sec);
    return st;
}

qn_status notify_send_from_check(const char *value, char *err, size_t errlen)
{
    if (notify_send_address_ok(value))
        return QN_OK;
    qn_errf(err, errlen, "not a mail address (a@b.c)");
    return QN_EINVAL;
}

static int notify_send_msg_id_ok(const char *id)
{
    size_t n = strlen(id);
    if (!n || n > NOTIFY_SEND_MSGID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x21 || (unsigned char)id[i] > 0x7e || id[i] == '<' ||
            id[i] == '>')
            return 0;
    return 1;
}

/* The subject header's value: line breaks and other controls become spaces; non-ASCII text
 * travels as RFC 2047 base64 words of whole UTF-8 characters, folded between words; past
 * NOTIFY_SEND_SUBJECT_MAX bytes it is cut. */
static void notify_send_put_subject(FILE *f, const char *s)
{
    size_t n = strnlen(s, NOTIFY_SEND_SUBJECT_MAX + 1);
    int ascii = 1;

    if (n > NOTIFY_SEND_SUBJECT_MAX)
        for (n = NOTIFY_SEND_SUBJECT_MAX; n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80; n--)
            ; /* cut before a character, not inside it */

    for (size_t i = 0; i < n; i++)
        ascii &= (unsigned char)s[i] < 0x80;
    for (size_t i = 0; i < n;) {
        unsigned char word[NOTIFY_SEND_WORD_BYTES], b64[4 * ((NOTIFY_SEND_WORD_BYTES + 2) / 3) + 1];
        size_t len = n - i < NOTIFY_SEND_WORD_BYTES ? n - i : NOTIFY_SEND_WORD_BYTES;
        while (!ascii && len > 1 && i + len < n && ((unsigned char)s[i + len] & 0xc0) == 0x80)
            len--; /* never split a character */
        for (size_t k = 0; k < len; k++) {
            unsigned char c = (unsigned char)s[i + k];
            word[k] = c < 0x20 || c == 0x7f ? ' ' : c;
        }
        if (ascii) {
            fwrite(word, 1, len, f);
        } else {
            EVP_EncodeBlock(b64, word, (int)len);
            fprintf(f, "%s=?UTF-8?B?%s?=", i ? "\r\n " : "", (const char *)b64);
        }
        i += len;
    }
}

/* The whole message: headers, then body with every line ending in CRLF (libcurl escapes the
 * lines that begin with a dot). Owned by the caller; NULL when out of memory. */
static char *notify_send_mail_text(const notify_send_msg *m, size_t *len)
{
    static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    time_t now = time(NULL);
    struct tm tm;

    if (!f)
        return NULL;
    gmtime_r(&now, &tm);
    fprintf(f, "From: <%s>\r\nTo: ", m->from);
    for (int i = 0; m->to[i]; i++)
        fprintf(f, "%s<%s>", i ? ", " : "", m->to[i]);
    fputs("\r\nSubject: ", f);
    notify_send_put_subject(f, m->subject ? m->subject : "");
    fprintf(f, "\r\nDate: %s, %02d %s %04d %02d:%02d:%02d +0000\r\n", days[tm.tm_wday], tm.tm_mday,
            months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
    if (m->msg_id)
        fprintf(f, "Message-ID: <%s>\r\n", m->msg_id);
    fputs("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n"
          "Content-Transfer-Encoding: 8bit\r\n\r\n",
          f);
    const char *b = m->body ? m->body : "";
    for (; *b; b++) {
        if (*b == '\r' && b[1] == '\n')
            continue; /* the \n writes the line end */
        if (*b == '\n' || *b == '\r')
            fputs("\r\n", f);
        else
            fputc(*b, f);
    }
    if (b != (m->body ? m->body : "") && b[-1] != '\n' && b[-1] != '\r')
        fputs("\r\n", f);
    if (ferror(f)) {
        fclose(f);
        free(text);
        return NULL;
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

typedef struct notify_send_reader {
    const char *p;
    size_t left;
} notify_send_reader;

static size_t notify_send_read(char *buf, size_t size, size_t n, void *arg)
{
    notify_send_reader *r = arg;
    size_t len = size * n < r->left ? size * n : r->left;
    memcpy(buf, r->p, len);
    r->p += len;
    r->left -= len;
    return len;
}

/* The mail's fields, before anything is sent. */
static qn_status notify_send_mail_check(const notify_send_msg *m, char *err, size_t errlen)
{
    int n = 0;

    if (!m || !m->to) {
        qn_errf(err, errlen, "smtp: no mail");
        return QN_EINVAL;
    }
    if (!notify_send_address_ok(m->from)) {
        qn_errf(err, errlen, "smtp: the sender address is malformed");
        return QN_EINVAL;
    }
    for (; m->to[n]; n++)
        if (n >= NOTIFY_SEND_MAX_TO || !notify_send_address_ok(m->to[n])) {
            qn_errf(err, errlen,
                    n >= NOTIFY_SEND_MAX_TO ? "smtp: more than %d recipients"
                                            : "smtp: recipient %d is malformed",
                    n >= NOTIFY_SEND_MAX_TO ? NOTIFY_SEND_MAX_TO : n + 1);
            return QN_EINVAL;
        }
    if (!n) {
        qn_errf(err, errlen, "smtp: no recipient");
        return QN_EINVAL;
    }
    if (m->msg_id && !notify_send_msg_id_ok(m->msg_id)) {
        qn_errf(err, errlen, "smtp: the message id is malformed");
        return QN_EINVAL;
    }
    return QN_OK;
}

qn_status notify_send_mail(const notify_send_msg *m, char *err, size_t errlen)
{
    notify_send_secrets sec = {0};
    CURL *curl = NULL;
    struct curl_slist *rcpt = NULL;
    char *text = NULL, from[NOTIFY_SEND_ADDRESS_MAX + 3], addr[NOTIFY_SEND_ADDRESS_MAX + 3];
    char cerr[CURL_ERROR_SIZE] = "";
    size_t len = 0;
    long code = 0;
    qn_status st = notify_send_mail_check(m, err, errlen);

    if (st != QN_OK)
        goto done;
    st = notify_send_url_check(m->smtp_url, "smtp", "smtp", "smtps", &sec, err, errlen);
    if (st != QN_OK)
        goto done;
    st = QN_ENOMEM;
    for (int i = 0; m->to[i]; i++) {
        snprintf(addr, sizeof(addr), "<%s>", m->to[i]);
        struct curl_slist *l = curl_slist_append(rcpt, addr);
        if (!l) {
            qn_errf(err, errlen, "smtp: out of memory");
            goto done;
        }
        rcpt = l;
    }
    text = notify_send_mail_text(m, &len);
    curl = notify_send_curl_new(m->smtp_url, m->timeout_ms, "smtp,smtps", cerr);
    if (!text || !curl) {
        qn_errf(err, errlen, "smtp: out of memory");
        goto done;
    }
    snprintf(from, sizeof(from), "<%s>", m->from);
    notify_send_reader body = {text, len};
    curl_easy_setopt(curl, CURLOPT_MAIL_FROM, from);
    curl_easy_setopt(curl, CURLOPT_MAIL_RCPT, rcpt);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, notify_send_read);
    curl_easy_setopt(curl, CURLOPT_READDATA, &body);
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    CURLcode rc = curl_easy_perform(curl);
    if (rc == CURLE_OK) {
        st = QN_OK;
        goto done;
    }
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    st = notify_send_curl_status(rc);
    /* A refusal by the relay: its reply code says whether to try again (4xx) or not (5xx). A
     * timed-out or broken session keeps the class of its transport error. */
    if (st == QN_EAGAIN && code >= 400 && code < 600)
        st = code < 500 ? QN_EAGAIN : QN_EINVAL;
    notify_send_curl_err(err, errlen, "smtp", rc, cerr, &sec);
done:
    curl_slist_free_all(rcpt);
    if (curl)
        curl_easy_cleanup(curl);
    free(text);
    notify_send_secrets_clear(&sec);
    return st;
}

int notify_send_retryable(qn_status st)
{
    return st != QN_OK && st != QN_EINVAL;
}
