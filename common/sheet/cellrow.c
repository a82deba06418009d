/* One spreadsheet row as the readers assemble it: see cellrow.h. */
#include "cellrow.h"

#include <stdlib.h>
#include <string.h>

int cellrow_buf_append(cellrow_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

void cellrow_buf_free(cellrow_buf *b)
{
    free(b->p);
    *b = (cellrow_buf){0};
}

void cellrow_reset(cellrow *r)
{
    r->arena.len = 0;
    r->nslots = 0;
}

/* Makes col a slot (and the ones before it, empty); NULL with *st set when it cannot. */
static cellrow_slot *cellrow_slot_at(cellrow *r, int col, qn_status *st)
{
    if (col < 0 || col >= SHEET_MAX_COLS) {
        *st = QN_EINVAL;
        return NULL;
    }
    if (col >= r->slots_cap) {
        int ncap = r->slots_cap ? r->slots_cap : 16;
        while (ncap <= col)
            ncap *= 2;
        cellrow_slot *ns = realloc(r->slots, (size_t)ncap * sizeof(*ns));
        if (!ns) {
            *st = QN_ENOMEM;
            return NULL;
        }
        r->slots = ns;
        r->slots_cap = ncap;
    }
    while (r->nslots <= col)
        r->slots[r->nslots++] = (cellrow_slot){"", 0};
    return &r->slots[col];
}

qn_status cellrow_set(cellrow *r, int col, size_t off)
{
    qn_status st = QN_OK;
    cellrow_slot *s = cellrow_slot_at(r, col, &st);
    if (s)
        *s = (cellrow_slot){NULL, off};
    return st;
}

qn_status cellrow_set_ext(cellrow *r, int col, const char *text)
{
    qn_status st = QN_OK;
    cellrow_slot *s = cellrow_slot_at(r, col, &st);
    if (s)
        *s = (cellrow_slot){text, 0};
    return st;
}

const char *cellrow_text(const cellrow *r, int col)
{
    if (col < 0 || col >= r->nslots)
        return "";
    const cellrow_slot *s = &r->slots[col];
    return s->ext ? s->ext : r->arena.p + s->off;
}

int cellrow_nonempty(const cellrow *r)
{
    for (int i = 0; i < r->nslots; i++)
        if (cellrow_text(r, i)[0])
            return 1;
    return 0;
}

qn_status cellrow_cells(cellrow *r, const char *const **out)
{
    if (r->nslots > r->cells_cap) {
        const char **nc = realloc(r->cells, (size_t)r->nslots * sizeof(*nc));
        if (!nc)
            return QN_ENOMEM;
        r->cells = nc;
        r->cells_cap = r->nslots;
    }
    /* Arena offsets become pointers only now: the arena may have moved while the row grew. */
    for (int i = 0; i < r->nslots; i++)
        r->cells[i] = cellrow_text(r, i);
    *out = r->cells;
    return QN_OK;
}

void cellrow_free(cellrow *r)
{
    cellrow_buf_free(&r->arena);
    free(r->slots);
    free(r->cells);
    *r = (cellrow){0};
}
