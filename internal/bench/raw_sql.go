package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmoutbox/outbox/sqlstore"
)

// payload is the body of every benchmark message: a small JSON document,
// since the classic outbox's table stores payloads as JSON.
var payload = []byte(`{"order_id":"4f6c1e0a-2b7d-4d8e-9a51-0c3f5b7e2d91","customer":"c-4711","amount_cents":12999,"currency":"EUR","items":3}`)

const sentKey = "bench_sent"

func sentMetadata() string {
	return `{"` + sentKey + `":"` + strconv.FormatInt(time.Now().UnixNano(), 10) + `"}`
}

// rawSQL is what the database itself can do: statements of the outbox's
// shape, on a table of the outbox's shape and the same pool, with no outbox
// code around them.
type rawSQL struct {
	d      *database
	store  *sqlstore.Store // owns the table
	insert string
	check  string
	mark   string
}

func newRawSQL(ctx context.Context, d *database) (*rawSQL, error) {
	s, err := d.newStoreOf(ctx, sqlstore.Coalescing{}, sqlstore.Mark) // the raw cycle marks
	if err != nil {
		return nil, err
	}
	clock := d.clock()
	t := s.Table()
	return &rawSQL{
		d:      d,
		store:  s,
		insert: d.db.Rebind("INSERT INTO " + t + " (topic, uuid, payload, metadata) VALUES (?, ?, ?, ?) RETURNING id"),
		check:  d.db.Rebind("SELECT 1 FROM " + t + " WHERE id = ? AND processed_at IS NULL"),
		mark:   d.db.Rebind("UPDATE " + t + " SET processed_at = " + clock + " WHERE id = ? AND processed_at IS NULL"),
	}, nil
}

func (r *rawSQL) close(ctx context.Context) { r.d.drop(ctx, r.store) }

func (r *rawSQL) insertOne(ctx context.Context) (int64, error) {
	var id int64
	err := r.d.db.QueryRowContext(ctx, r.insert, "bench", watermill.NewUUID(), payload, sentMetadata()).Scan(&id)
	return id, err
}

// rawInsert is a loop of single-row INSERTs per writer.
func rawInsert(ctx context.Context, d *database, writers int, dur time.Duration) (result, error) {
	r, err := newRawSQL(ctx, d)
	if err != nil {
		return result{}, err
	}
	defer r.close(ctx)
	res := loop(ctx, writers, dur, func(ctx context.Context, _ int) (int, error) {
		_, err := r.insertOne(ctx)
		return 1, err
	})
	return res, errorsOf("raw insert", res)
}

// rawCycle is the whole life of one record as raw SQL: INSERT, SELECT by id,
// UPDATE.
func rawCycle(ctx context.Context, d *database, writers int, dur time.Duration) (result, error) {
	r, err := newRawSQL(ctx, d)
	if err != nil {
		return result{}, err
	}
	defer r.close(ctx)
	res := loop(ctx, writers, dur, func(ctx context.Context, _ int) (int, error) {
		id, err := r.insertOne(ctx)
		if err != nil {
			return 0, err
		}
		var one int
		if err := r.d.db.QueryRowContext(ctx, r.check, id).Scan(&one); err != nil {
			return 0, err
		}
		res, err := r.d.db.ExecContext(ctx, r.mark, id)
		if err != nil {
			return 0, err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return 0, fmt.Errorf("mark changed %d rows: %v", n, err)
		}
		return 1, nil
	})
	return res, errorsOf("raw cycle", res)
}

// rawBatchInsert is one writer inserting rows rows per statement.
func rawBatchInsert(ctx context.Context, d *database, rows int, dur time.Duration) (result, error) {
	r, err := newRawSQL(ctx, d)
	if err != nil {
		return result{}, err
	}
	defer r.close(ctx)
	var b strings.Builder
	b.WriteString("INSERT INTO " + r.store.Table() + " (topic, uuid, payload, metadata) VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?, ?, ?, ?)")
	}
	b.WriteString(" RETURNING id")
	query := d.db.Rebind(b.String())
	res := loop(ctx, 1, dur, func(ctx context.Context, _ int) (int, error) {
		args := make([]any, 0, rows*4)
		for range rows {
			args = append(args, "bench", watermill.NewUUID(), payload, sentMetadata())
		}
		got, err := d.db.QueryContext(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		defer got.Close()
		n := 0
		for got.Next() {
			var id int64
			if err := got.Scan(&id); err != nil {
				return 0, err
			}
			n++
		}
		return n, got.Err()
	})
	return res, errorsOf("raw batch insert", res)
}
