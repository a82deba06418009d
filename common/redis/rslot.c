/* Redis Cluster hash slots of keys and commands (rslot.h). */
#include "rslot.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as the Redis Cluster specification
 * defines the key hash. By a table: every command of the event loop's client is checked, the
 * claim's four keys among them. */
static uint16_t rslot_table[256];

static void rslot_table_init(void)
{
    for (int i = 0; i < 256; i++) {
        uint16_t crc = (uint16_t)(i << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
        rslot_table[i] = crc;
    }
}

static uint16_t rslot_crc16(const char *buf, size_t len)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    uint16_t crc = 0;
    pthread_once(&once, rslot_table_init);
    for (size_t i = 0; i < len; i++)
        crc = (uint16_t)(crc << 8) ^ rslot_table[((crc >> 8) ^ (unsigned char)buf[i]) & 0xff];
    return crc;
}

int rslot_of_key(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(key + from, '}', len - from);
        if (close && close > key + from)
            return rslot_crc16(key + from, (size_t)(close - (key + from))) & (RSLOT_COUNT - 1);
    }
    return rslot_crc16(key, len) & (RSLOT_COUNT - 1);
}

/* How a command names its keys. */
typedef enum {
    RSLOT_FIRST = 0,    /* argv[1] (every single-key command: the default) */
    RSLOT_NOKEY,        /* none */
    RSLOT_ALL,          /* argv[1..] */
    RSLOT_ALL_BUT_LAST, /* argv[1..argc-2] (BLPOP k1 k2 timeout) */
    RSLOT_TWO,          /* argv[1], argv[2] */
    RSLOT_PAIRS,        /* argv[1], argv[3], ... (MSET k v k v) */
    RSLOT_NUMKEYS,      /* argv[2] is the count, keys from argv[3] (EVAL, EVALSHA, FCALL) */
} rslot_shape;

static const struct {
    const char *name;
    rslot_shape shape;
} rslot_commands[] = {
    {"ASKING", RSLOT_NOKEY},
    {"AUTH", RSLOT_NOKEY},
    {"BLPOP", RSLOT_ALL_BUT_LAST},
    {"BRPOP", RSLOT_ALL_BUT_LAST},
    {"BZPOPMIN", RSLOT_ALL_BUT_LAST},
    {"BZPOPMAX", RSLOT_ALL_BUT_LAST},
    {"CLIENT", RSLOT_NOKEY},
    {"CLUSTER", RSLOT_NOKEY},
    {"COMMAND", RSLOT_NOKEY},
    {"CONFIG", RSLOT_NOKEY},
    {"DBSIZE", RSLOT_NOKEY},
    {"DEL", RSLOT_ALL},
    {"ECHO", RSLOT_NOKEY},
    {"EVAL", RSLOT_NUMKEYS},
    {"EVALSHA", RSLOT_NUMKEYS},
    {"EVAL_RO", RSLOT_NUMKEYS},
    {"EVALSHA_RO", RSLOT_NUMKEYS},
    {"EXISTS", RSLOT_ALL},
    {"FCALL", RSLOT_NUMKEYS},
    {"FLUSHALL", RSLOT_NOKEY},
    {"FLUSHDB", RSLOT_NOKEY},
    {"HELLO", RSLOT_NOKEY},
    {"INFO", RSLOT_NOKEY},
    {"KEYS", RSLOT_NOKEY},
    {"LMOVE", RSLOT_TWO},
    {"MGET", RSLOT_ALL},
    {"MSET", RSLOT_PAIRS},
    {"MSETNX", RSLOT_PAIRS},
    {"PING", RSLOT_NOKEY},
    {"PSUBSCRIBE", RSLOT_NOKEY},
    {"PUBLISH", RSLOT_NOKEY},
    {"QUIT", RSLOT_NOKEY},
    {"READONLY", RSLOT_NOKEY},
    {"RENAME", RSLOT_TWO},
    {"RENAMENX", RSLOT_TWO},
    {"ROLE", RSLOT_NOKEY},
    {"RPOPLPUSH", RSLOT_TWO},
    {"SCAN", RSLOT_NOKEY},
    {"SCRIPT", RSLOT_NOKEY},
    {"SELECT", RSLOT_NOKEY},
    {"SMOVE", RSLOT_TWO},
    {"SUBSCRIBE", RSLOT_NOKEY},
    {"TIME", RSLOT_NOKEY},
    {"TOUCH", RSLOT_ALL},
    {"UNLINK", RSLOT_ALL},
    {"UNWATCH", RSLOT_NOKEY},
    {"WAIT", RSLOT_NOKEY},
    {"WATCH", RSLOT_ALL},
};

static rslot_shape rslot_shape_of(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof(rslot_commands) / sizeof(rslot_commands[0]); i++)
        if (strlen(rslot_commands[i].name) == len &&
            strncasecmp(rslot_commands[i].name, name, len) == 0)
            return rslot_commands[i].shape;
    return RSLOT_FIRST;
}

/* Folds key i into *slot: the first key sets it, any other slot makes it RSLOT_CROSS. */
static void rslot_fold(int *slot, const char *key, size_t len)
{
    int s = rslot_of_key(key, len);
    if (*slot == RSLOT_NONE)
        *slot = s;
    else if (*slot != s)
        *slot = RSLOT_CROSS;
}

int rslot_of_command(int argc, const char *const *argv, const size_t *argvlen)
{
    int slot = RSLOT_NONE, from = 1, to = argc, step = 1;
    if (argc < 1)
        return RSLOT_CROSS;
    switch (rslot_shape_of(argv[0], argvlen[0])) {
    case RSLOT_NOKEY:
        return RSLOT_NONE;
    case RSLOT_FIRST:
        to = argc > 1 ? 2 : 1;
        break;
    case RSLOT_ALL:
        break;
    case RSLOT_ALL_BUT_LAST:
        to = argc - 1;
        break;
    case RSLOT_TWO:
        to = argc < 3 ? argc : 3;
        break;
    case RSLOT_PAIRS:
        step = 2;
        break;
    case RSLOT_NUMKEYS: {
        char num[12];
        char *end;
        if (argc < 3 || argvlen[2] == 0 || argvlen[2] >= sizeof(num))
            return RSLOT_CROSS;
        memcpy(num, argv[2], argvlen[2]);
        num[argvlen[2]] = '\0';
        long n = strtol(num, &end, 10);
        if (*end || n < 0 || n > argc - 3)
            return RSLOT_CROSS;
        from = 3;
        to = 3 + (int)n;
        break;
    }
    }
    for (int i = from; i < to && slot != RSLOT_CROSS; i += step)
        rslot_fold(&slot, argv[i], argvlen[i]);
    return slot;
}

/* The decimal after *p up to "\r\n"; advances *p past it. -1 when malformed. */
static long rslot_resp_len(const char **p, const char *end)
{
    long n = 0;
    const char *q = *p;
    if (q >= end || *q < '0' || *q > '9')
        return -1;
    while (q < end && *q >= '0' && *q <= '9') {
        n = n * 10 + (*q++ - '0');
        if (n > (1L << 40))
            return -1;
    }
    if (end - q < 2 || q[0] != '\r' || q[1] != '\n')
        return -1;
    *p = q + 2;
    return n;
}

int rslot_parse_request(const char *cmd, size_t len, const char **argv, size_t *argvlen, int max)
{
    const char *p = cmd, *end = cmd + len;
    if (len < 1 || *p++ != '*')
        return -1;
    long argc = rslot_resp_len(&p, end);
    if (argc < 0 || argc > max)
        return -1;
    for (long i = 0; i < argc; i++) {
        if (p >= end || *p++ != '$')
            return -1;
        long n = rslot_resp_len(&p, end);
        if (n < 0 || end - p < n + 2 || p[n] != '\r' || p[n + 1] != '\n')
            return -1;
        argv[i] = p;
        argvlen[i] = (size_t)n;
        p += n + 2;
    }
    return p == end ? (int)argc : -1;
}

int rslot_range_of(const redisReply *e, rslot_range *out)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_INTEGER ||
        e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
        e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
        e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
        return 0;
    long long from = e->element[0]->integer, to = e->element[1]->integer;
    long long port = e->element[2]->element[1]->integer;
    if (from < 0 || to < from || to >= RSLOT_COUNT || port < 1 || port > 65535)
        return 0;
    out->from = (int)from;
    out->to = (int)to;
    out->host = e->element[2]->element[0]->str;
    out->hostlen = e->element[2]->element[0]->len;
    out->port = (int)port;
    return 1;
}
