/*
 * Outgoing notifications through libcurl: a JSON POST to a webhook, and a mail through an SMTP
 * relay. Blocking, each call its own connection and bounded by its timeout: call these from a
 * consumer or worker thread, never on the event loop.
 *
 * Failures say whether trying again can help:
 *   QN_EAGAIN     the peer could not be reached or refused for now: connection refused or
 *                 reset, name not resolved, HTTP 5xx, 408 or 429, SMTP 4xx
 *   QN_ETIMEDOUT  no answer within the timeout
 *   QN_ENOMEM, QN_ERR  a local failure
 *   QN_EINVAL     never: a bad or unsupported URL, a malformed address, HTTP 4xx (and any other
 *                 non-2xx answer), an SMTP 5xx, a refused login
 * notify_send_retryable() tells the two apart. Each failure also explains itself in err (the
 * err/errlen convention of status.h), which never holds a URL or its password (an SMTP URL may
 * carry one); nothing here logs.
 *
 * The URLs are the operator's configuration, not user input: internal addresses are allowed
 * (unlike fetch.h's task files); only http/https, and smtp/smtps, are, and no redirect is
 * followed (a 3xx is a permanent failure).
 */
#ifndef QUAN_NOTIFY_SEND_H
#define QUAN_NOTIFY_SEND_H

#include <stddef.h>

#include "config.h"
#include "status.h"

#define NOTIFY_SEND_ERR_LEN     256 /* enough for every message of this module */
#define NOTIFY_SEND_ADDRESS_MAX 254 /* the longest address SMTP allows */
#define NOTIFY_SEND_MAX_TO      100 /* recipients of one mail */
#define NOTIFY_SEND_SUBJECT_MAX 998 /* bytes of the subject sent (before it is encoded) */
#define NOTIFY_SEND_MSGID_MAX   200
#define NOTIFY_SEND_URL_MAX     2048

/* POSTs json (borrowed, sent as is with Content-Type: application/json) to url (http or https;
 * borrowed); delivered when the answer is 2xx (its body is discarded). timeout_ms bounds the
 * whole exchange, connection included. */
qn_status notify_send_webhook(const char *url, const char *json, long timeout_ms, char *err,
                              size_t errlen) QN_MUSTCHECK;

/* One mail; every pointer is borrowed for the call. */
typedef struct notify_send_msg {
    const char *smtp_url;  /* smtp:// or smtps://[user:password@]host[:port]: secret */
    const char *from;      /* bare address (a@b.c): envelope sender and From: */
    const char *const *to; /* bare addresses, NULL-terminated, 1..NOTIFY_SEND_MAX_TO */
    const char *subject;   /* UTF-8; line breaks become spaces, non-ASCII is RFC 2047 encoded,
                              cut past NOTIFY_SEND_SUBJECT_MAX bytes */
    const char *body;      /* UTF-8 text/plain; lines end in LF or CRLF */
    const char *msg_id;    /* Message-ID without its <>, or NULL for none */
    long timeout_ms;       /* the whole SMTP session */
} notify_send_msg;

/* Sends m through m->smtp_url; delivered when the relay accepted it for every recipient (one
 * refused recipient fails the whole mail). Addresses are checked (notify_send_address_ok) before
 * anything is sent: a bad one is QN_EINVAL. */
qn_status notify_send_mail(const notify_send_msg *m, char *err, size_t errlen) QN_MUSTCHECK;

/* 1 if a failure st of the functions above may succeed when tried again, else 0 (QN_OK: 0). */
int notify_send_retryable(qn_status st);

/* 1 if addr is a bare mail address this module sends to: local@domain, printable ASCII without
 * spaces, quotes, angle brackets or separators, at most NOTIFY_SEND_ADDRESS_MAX bytes. */
int notify_send_address_ok(const char *addr);

/* The mail relay's settings, declared once for every binary that sends mail (the engine's
 * reminders, distribution's task notifications), with their checks at start: the URL empty (no
 * mail is sent) or one notify_send_mail accepts, the sender an address notify_send_address_ok
 * accepts. T is the module's settings struct, with const char *smtp_url and *smtp_from. */
#define NOTIFY_SEND_SMTP_CONFIG_VARS(T) NOTIFY_SEND_SMTP_URL_VAR(T), NOTIFY_SEND_SMTP_FROM_VAR(T)
#define NOTIFY_SEND_SMTP_URL_VAR(T)                                                                \
    {                                                                                              \
        "QUAN_SMTP_URL", CONFIG_STR, offsetof(T, smtp_url), "", 0, NOTIFY_SEND_URL_MAX, NULL,      \
            CONFIG_SECRET,                                                                         \
            "smtp(s)://[user:password@]host:port of the mail relay (empty: no mail is sent)",      \
            notify_send_smtp_url_check                                                             \
    }
#define NOTIFY_SEND_SMTP_FROM_VAR(T)                                                               \
    {                                                                                              \
        "QUAN_SMTP_FROM", CONFIG_STR, offsetof(T, smtp_from), "quan@localhost", 3,                 \
            NOTIFY_SEND_ADDRESS_MAX, NULL, 0, "sender address of the mails (a@b.c)",               \
            notify_send_from_check                                                                 \
    }

/* The checks of those rows (config_var.check); err never quotes the value. */
qn_status notify_send_smtp_url_check(const char *value, char *err, size_t errlen) QN_MUSTCHECK;
qn_status notify_send_from_check(const char *value, char *err, size_t errlen) QN_MUSTCHECK;

#endif
