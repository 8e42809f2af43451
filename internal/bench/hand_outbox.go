package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
)

const handIDKey = "bench_hand_id"

// handPipeline is an outbox written by hand with the project's statements
// and nothing else: Publish inserts the record (INSERT … RETURNING id) and
// sends the message with the id; around the handler, a SELECT by id checks
// that the record is pending and an UPDATE completes it. No batching, no
// retries: what the statements cost, through the same GoChannel and router.
func handPipeline(ctx context.Context, d *database) (pipeline, error) {
	r, err := newRawSQL(ctx, d)
	if err != nil {
		return pipeline{}, err
	}
	gc := newGoChannel()
	return pipeline{
		pub:        &handPublisher{r: r, next: gc},
		sub:        gc,
		middleware: []message.HandlerMiddleware{r.handMiddleware},
		close: func() {
			_ = gc.Close()
			r.close(context.Background())
		},
	}, nil
}

type handPublisher struct {
	r    *rawSQL
	next message.Publisher
}

func (p *handPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		md, err := json.Marshal(msg.Metadata)
		if err != nil {
			return err
		}
		var id int64
		if err := p.r.d.db.QueryRowContext(msg.Context(), p.r.insert, topic, msg.UUID, []byte(msg.Payload), string(md)).Scan(&id); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		msg.Metadata.Set(handIDKey, strconv.FormatInt(id, 10))
	}
	return p.next.Publish(topic, msgs...)
}

func (p *handPublisher) Close() error { return nil }

// handMiddleware runs the handler for a pending record and completes it; a
// record already completed is acknowledged without running the handler.
func (r *rawSQL) handMiddleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id, err := strconv.ParseInt(msg.Metadata.Get(handIDKey), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("message without %s: %w", handIDKey, err)
		}
		ctx := msg.Context()
		var one int
		switch err := r.d.db.QueryRowContext(ctx, r.check, id).Scan(&one); {
		case err == nil:
		case errors.Is(err, sql.ErrNoRows):
			return nil, nil
		default:
			return nil, err
		}
		out, err := h(msg)
		if err != nil {
			return out, err
		}
		if _, err := r.d.db.ExecContext(ctx, r.mark, id); err != nil {
			return nil, err
		}
		return out, nil
	}
}
