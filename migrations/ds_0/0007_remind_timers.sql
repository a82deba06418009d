-- Reminder timers. t_coupon_template_remind.information keeps the reference's bitmap
-- (bit = type * 12 + remindTime / 5 - 1); this table adds, per set bit, the generation of the
-- timer that was scheduled for it: the outbox row of a reminder has the key
-- remind:<user>:<template>:<type>:<minutes>:<generation>, and the consumer delivers a message
-- only if its generation is the slot's current one and not yet sent. So a cancelled reminder
-- never fires (row gone), and a reminder re-created after a cancel fires once (new generation;
-- a message of the old one still in flight is skipped).
CREATE TABLE t_coupon_template_remind_timer (
    user_id            bigint      NOT NULL,
    coupon_template_id bigint      NOT NULL,
    slot               smallint    NOT NULL CHECK (slot BETWEEN 0 AND 63), -- the bitmap bit
    generation         bigint      NOT NULL, -- snowflake id of this creation
    fire_at            timestamptz NOT NULL,
    sent_at            timestamptz,          -- delivered: a redelivery after this is skipped
    create_time        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, coupon_template_id, slot)
);
