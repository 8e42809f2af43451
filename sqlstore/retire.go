package sqlstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/wmoutbox/outbox/recordstore"
)

var _ recordstore.ConsumerRetirer = (*Store)(nil)

// retireBatch is how many deliveries one transaction of Retire completes.
const retireBatch = 200

// buildRetire builds the statement that picks the next batch of a
// consumer's pending deliveries of a topic, by record id, through the
// consumers table's pending index (consumer, record_id).
func (q *queries) buildRetire(f fragments) {
	q.retireSelect = fmt.Sprintf(`SELECT c.record_id FROM %s c JOIN %s r ON r.id = c.record_id
WHERE c.consumer = %s AND r.topic = %s AND c.record_id > %s AND %s
ORDER BY c.record_id LIMIT %s`, f.tc, f.t, f.p(1), f.p(2), f.p(3), cPending, f.p(4))
}

// Retire implements [recordstore.ConsumerRetirer]: it completes the
// consumer's pending deliveries of the topic with the database clock, a
// batch of at most 200 per transaction, each as Complete completes one
// (the record's row locked first, then rolled up: marked, or deleted with
// its delivery rows, once no delivery is left pending), and returns how
// many it completed, also when it stops on an error.
//
// First it reads the topic's latest declaration ([Store.DeclareConsumers],
// which outbox.Replay calls at each start): a consumer it lists is refused
// with a [*recordstore.ConsumerDeclaredError], nothing completed. A topic
// no start declared (a table of a service that does not replay, or of a
// version before declarations) is retired as asked.
func (s *Store) Retire(ctx context.Context, topic, consumer string) (int, error) {
	db, err := s.pool()
	if err != nil {
		return 0, err
	}
	if err := s.checkDeclared(ctx, db, topic, consumer); err != nil {
		return 0, err
	}
	total := 0
	var after int64
	for {
		var ids []int64
		if err := db.SelectContext(ctx, &ids, s.q.retireSelect, consumer, topic, after, retireBatch); err != nil {
			return total, s.fail("retire", err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		n := 0
		err := s.inTx(ctx, db, "retire", func(tx executor) error {
			n = 0
			for _, id := range ids {
				err := s.completeDelivery(ctx, tx, recordstore.Delivery{ID: id, Topic: topic, Consumer: consumer}, "retire", s.q.lockRecord)
				switch {
				case errors.Is(err, recordstore.ErrNotPending):
					// Completed meanwhile by the consumer itself.
				case err != nil:
					return err
				default:
					n++
				}
			}
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("retiring consumer %q of topic %q after record %d: %w", consumer, topic, after, err)
		}
		total += n
		if len(ids) < retireBatch {
			return total, nil
		}
		after = ids[len(ids)-1]
	}
}
