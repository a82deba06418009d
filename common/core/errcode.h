/*
 * Every error the HTTP APIs answer, once: its name, HTTP status, envelope code and default
 * message. Handlers name the error (ERRCODE_SOLD_OUT), never a status and a code of their own, so
 * the two cannot drift apart; the message says what the caller needs (the field, the limit),
 * or is the default. docs/api.md's status table lists exactly these pairs
 * (integration-tests/test_openapi.sh checks it against this list).
 *
 * One code may go with two statuses, each its own entry: A000001 (400, 413) and A000409 (409 a
 * duplicate that is final, 429 an answer to try again).
 */
#ifndef QUAN_ERRCODE_H
#define QUAN_ERRCODE_H

/* X(name, HTTP status, envelope code, default message) */
#define ERRCODE_LIST(X)                                                                            \
    X(ERRCODE_INVALID, 400, "A000001", "invalid input")                                            \
    X(ERRCODE_UNAUTHORIZED, 401, "A000401", "missing or invalid identity")                         \
    X(ERRCODE_NOT_FOUND, 404, "A000404", "not found")                                              \
    X(ERRCODE_METHOD, 405, "A000405", "method not allowed")                                        \
    X(ERRCODE_DUPLICATE, 409, "A000409", "duplicate")                                              \
    X(ERRCODE_SOLD_OUT, 409, "B000100", "stock exhausted")                                         \
    X(ERRCODE_LIMIT, 409, "B000101", "per-user limit reached")                                     \
    X(ERRCODE_WINDOW, 409, "B000102", "not within the claim window")                               \
    X(ERRCODE_ENDED, 409, "B000103", "ended")                                                      \
    X(ERRCODE_STATE, 409, "B000104", "the state does not allow this")                              \
    X(ERRCODE_TOO_LARGE, 413, "A000001", "request body too large")                                 \
    X(ERRCODE_AGAIN, 429, "A000409",                                                               \
      "in progress, or waiting for what is not settled yet; try again")                            \
    X(ERRCODE_BUSY, 429, "A000429", "busy; try again")                                             \
    X(ERRCODE_INTERNAL, 500, "B000001", "internal error")                                          \
    X(ERRCODE_UNAVAILABLE, 503, "C000001", "unavailable; try again")

#define ERRCODE_ENUM_(name, status, code, msg) name,
typedef enum { ERRCODE_LIST(ERRCODE_ENUM_) ERRCODE_COUNT } errcode;
#undef ERRCODE_ENUM_

typedef struct errcode_info {
    int status;
    const char *code;
    const char *msg;
} errcode_info;

/* The row of e (static; an unknown e is ERRCODE_INTERNAL's). */
static inline const errcode_info *errcode_of(errcode e)
{
#define ERRCODE_ROW_(name, status, code, msg) [name] = {status, code, msg},
    static const errcode_info rows[ERRCODE_COUNT] = {ERRCODE_LIST(ERRCODE_ROW_)};
#undef ERRCODE_ROW_
    return (unsigned)e < ERRCODE_COUNT ? &rows[e] : &rows[ERRCODE_INTERNAL];
}

#endif
