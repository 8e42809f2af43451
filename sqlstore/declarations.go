package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.ConsumerDeclarer = (*Store)(nil)

// maxDeclared bounds the rows of one start's declarations, topics and
// consumers together, so that its one statement stays within every
// database's limit of bound parameters (four a row).
const maxDeclared = 5000

// buildDeclarations builds the statements of the declarations table
// (<table>_declared): a row per topic, with consumer "" (no consumer is
// named so), for the start that declared it last, and a row per consumer a
// start declared, with whether it is remote. Every row carries the start
// that wrote it (start_id) and when (declared_at, the database clock): a
// consumer is declared while its row's start is its topic row's.
func (q *queries) buildDeclarations(f fragments) {
	q.declare = fmt.Sprintf("INSERT INTO %s (topic, consumer, remote, start_id, declared_at) VALUES ", f.td)
	in := f.d.inserted
	q.declareUpsert = f.d.upsert("topic, consumer", fmt.Sprintf("remote = %s, start_id = %s, declared_at = %s",
		in("remote"), in("start_id"), in("declared_at")))
	q.declaredConsumer = fmt.Sprintf(`SELECT c.remote, %s FROM %s c JOIN %s s ON s.topic = c.topic AND s.consumer = '' AND s.start_id = c.start_id
WHERE c.topic = %s AND c.consumer = %s`, f.d.ageMicros("c.declared_at"), f.td, f.td, f.p(1), f.p(2))
	q.remoteConsumers = fmt.Sprintf("SELECT topic, consumer FROM %s WHERE remote AND consumer <> ''", f.td)
}

// DeclareConsumers implements [recordstore.ConsumerDeclarer] with one
// upsert of the declarations table, its rows in (topic, consumer) order.
// It refuses, writing nothing, with an error wrapping [ErrInvalidConfig],
// declarations with an empty or repeated topic, an empty consumer, a
// consumer listed twice for one topic (local and remote included), or
// more than 5000 topics and consumers in all.
func (s *Store) DeclareConsumers(ctx context.Context, decls []recordstore.Declaration) error {
	rows, err := declaredRows(decls)
	if err != nil || len(rows) == 0 {
		return err
	}
	db, err := s.pool()
	if err != nil {
		return err
	}
	start := newIdentity()
	var b strings.Builder
	b.WriteString(s.q.declare)
	args := make([]any, 0, 4*len(rows))
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&b, "(%s, %s, %s, %s, %s)", s.dialect.placeholder(n+1), s.dialect.placeholder(n+2), s.dialect.placeholder(n+3),
			s.dialect.placeholder(n+4), s.dialect.clock)
		args = append(args, r.topic, r.consumer, r.remote, start)
	}
	b.WriteString(s.q.declareUpsert)
	if _, err := db.ExecContext(ctx, b.String(), args...); err != nil {
		return s.fail("declare consumers", err)
	}
	return nil
}

// declaredRow is one row of the declarations table.
type declaredRow struct {
	topic, consumer string
	remote          bool
}

// declaredRows checks the declarations and returns their rows, in key
// order, so that two starts writing at once lock the rows in one order.
func declaredRows(decls []recordstore.Declaration) ([]declaredRow, error) {
	var rows []declaredRow
	topics := map[string]bool{}
	for _, d := range decls {
		switch {
		case d.Topic == "":
			return nil, fmt.Errorf("%w: a declaration has no topic", ErrInvalidConfig)
		case topics[d.Topic]:
			return nil, fmt.Errorf("%w: topic %q is declared twice", ErrInvalidConfig, d.Topic)
		}
		topics[d.Topic] = true
		rows = append(rows, declaredRow{topic: d.Topic})
		all := slices.Concat(d.Consumers, d.RemoteConsumers)
		for i, c := range all {
			switch {
			case c == "":
				return nil, fmt.Errorf("%w: topic %q declares an empty consumer", ErrInvalidConfig, d.Topic)
			case slices.Index(all, c) != i:
				return nil, fmt.Errorf("%w: topic %q declares consumer %q twice", ErrInvalidConfig, d.Topic, c)
			}
			rows = append(rows, declaredRow{topic: d.Topic, consumer: c, remote: i >= len(d.Consumers)})
		}
	}
	if len(rows) > maxDeclared {
		return nil, fmt.Errorf("%w: %d topics and consumers declared, more than %d", ErrInvalidConfig, len(rows), maxDeclared)
	}
	slices.SortFunc(rows, func(a, b declaredRow) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), strings.Compare(a.consumer, b.consumer))
	})
	return rows, nil
}

// checkDeclared returns a [*recordstore.ConsumerDeclaredError] when the
// topic's latest declaration lists the consumer, nil when it does not or
// the topic was never declared.
func (s *Store) checkDeclared(ctx context.Context, db executor, topic, consumer string) error {
	var remote bool
	var age sql.NullInt64
	err := db.QueryRowContext(ctx, s.q.declaredConsumer, topic, consumer).Scan(&remote, &age)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return s.fail("read declarations", err)
	}
	return &recordstore.ConsumerDeclaredError{Topic: topic, Consumer: consumer, Remote: remote, Since: ageOf(age)}
}

// addRemote marks the consumers that a declaration listed as remote (see
// [recordstore.ConsumerStatus.Remote]).
func (s *Store) addRemote(ctx context.Context, db executor, out []recordstore.TopicStatus) error {
	rows, err := db.QueryContext(ctx, s.q.remoteConsumers)
	if err != nil {
		return s.fail("status", err)
	}
	defer rows.Close()
	remote := map[[2]string]bool{}
	for rows.Next() {
		var topic, consumer string
		if err := rows.Scan(&topic, &consumer); err != nil {
			return s.fail("status", err)
		}
		remote[[2]string{topic, consumer}] = true
	}
	if err := rows.Err(); err != nil {
		return s.fail("status", err)
	}
	for i := range out {
		for j := range out[i].Consumers {
			cs := &out[i].Consumers[j]
			cs.Remote = remote[[2]string{out[i].Topic, cs.Consumer}]
		}
	}
	return nil
}

// CheckRetire reports whether [Store.Retire] would refuse the consumer of
// the topic, before an operator is asked to confirm it: a
// [*recordstore.ConsumerDeclaredError] when the topic's latest declaration
// lists it, nil when Retire would complete its deliveries.
func (o *Operator) CheckRetire(ctx context.Context, topic, consumer string) error {
	db, err := o.s.pool()
	if err != nil {
		return err
	}
	return o.s.checkDeclared(ctx, db, topic, consumer)
}
