/*
 * The sweep: every QUAN_DIST_SWEEP_MS each replica looks, in ONE ds_0 transaction, for tasks in
 * progress (status 1) whose run stopped — no live lease (a process that died, a run that gave
 * its lease up, a task never taken) and untouched for a sweep interval — and writes a new
 * task.execute for each into the outbox (key task.execute:<id>:resume:<ms>), touching the row
 * so the next sweep leaves it alone for an interval. Rows are claimed with FOR UPDATE SKIP
 * LOCKED, so replicas sweep disjoint tasks. Nothing depends on a message surviving: a task
 * whose message was lost, dead-lettered or is behind a dead consumer is run again, and resumes
 * after its last committed chunk. A copy too many is harmless (ownership is a conditional
 * update; taskrun.h).
 */
#ifndef QUAN_SWEEP_H
#define QUAN_SWEEP_H

#include "dist.h"

#endif
