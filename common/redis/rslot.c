/* Redis Cluster hash slots of keys, and the ranges of CLUSTER SLOTS (rslot.h). */
#include "rslot.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

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
