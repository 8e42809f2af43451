package outboxtest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/wmoutbox/outbox/recordstore"
)

// Release implements [recordstore.Releaser]: it ends the lease of a
// pending delivery when d.Lease still holds it.
func (s *Store) Release(ctx context.Context, d recordstore.Delivery) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.attemptOf(d); a != nil && a.leaseOwner == d.Lease {
		a.leaseOwner, a.leaseUntil = "", time.Time{}
	}
	return nil
}

// attemptOf returns the bookkeeping of a pending delivery: the record's,
// or the consumer's delivery's; nil when it is not pending.
func (s *Store) attemptOf(d recordstore.Delivery) *attempt {
	r := s.byID[d.ID]
	switch {
	case r == nil || !r.pending():
		return nil
	case r.deliveries == nil:
		return &r.attempt
	}
	if dl := r.deliveries[d.Consumer]; dl != nil && dl.pending() {
		return &dl.attempt
	}
	return nil
}

// RecordFailure implements [recordstore.FailureRecorder], keeping the whole
// reason.
func (s *Store) RecordFailure(ctx context.Context, d recordstore.Delivery, reason string, maxAttempts int, retryIn func(attempts int) time.Duration) (int, bool, error) {
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.byID[d.ID]; r != nil {
		r.adopt(d)
	}
	a := s.attemptOf(d)
	if a == nil {
		return 0, false, recordstore.ErrNotPending
	}
	now := s.now()
	a.attempts++
	a.lastError = reason
	if maxAttempts > 0 && a.attempts >= maxAttempts {
		r := s.byID[d.ID]
		if r.deliveries == nil {
			r.abandoned = now
		} else {
			r.deliveries[d.Consumer].abandoned = now
			s.rollUp(r, now)
		}
		return a.attempts, true, nil
	}
	var delay time.Duration
	if retryIn != nil {
		delay = max(retryIn(a.attempts), 0)
	}
	a.due = now.Add(delay)
	return a.attempts, false, nil
}

// Requeue implements [recordstore.Requeuer]: the record and its abandoned
// deliveries are pending again with their attempts reset, due at once,
// and the record counts as sent now. The last errors are kept.
func (s *Store) Requeue(ctx context.Context, id int64) (recordstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return recordstore.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.byID[id]
	if r == nil || r.abandoned.IsZero() {
		return recordstore.Record{}, fmt.Errorf("outboxtest: record %d: %w", id, recordstore.ErrNotAbandoned)
	}
	revive := func(a *attempt) { a.attempts, a.due, a.leaseOwner, a.leaseUntil = 0, time.Time{}, "", time.Time{} }
	r.abandoned, r.completed = time.Time{}, time.Time{}
	revive(&r.attempt)
	for _, dl := range r.deliveries {
		if !dl.abandoned.IsZero() {
			dl.abandoned = time.Time{}
			revive(&dl.attempt)
		}
	}
	r.lastSent = s.now()
	return copyRecord(r.rec), nil
}

// ClaimStale implements [recordstore.StaleClaimer].
func (s *Store) ClaimStale(ctx context.Context, topic string, afterID int64, olderThan time.Duration, limit int) ([]recordstore.Record, error) {
	return s.claim(ctx, topic, nil, afterID, olderThan, limit, 0, false)
}

// PutBack implements [recordstore.KeyClaimer].
func (s *Store) PutBack(ctx context.Context, topic string, id int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.byID[id]; r != nil && r.rec.Topic == topic && r.pending() {
		r.lastSent = time.Unix(0, 0)
	}
	return nil
}

// ClaimKey implements [recordstore.KeyClaimer].
func (s *Store) ClaimKey(ctx context.Context, topic, key string, afterID int64, olderThan time.Duration) ([]recordstore.Record, error) {
	return s.claim(ctx, topic, &key, afterID, olderThan, 1, 0, false)
}

// PredecessorMessages implements [recordstore.KeyPredecessorMessages].
func (s *Store) PredecessorMessages(ctx context.Context, topic string, ids []int64, skipAbandoned bool) (map[int64]recordstore.Predecessor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int64]recordstore.Predecessor, len(ids))
	for _, id := range ids {
		r := s.byID[id]
		if r == nil || r.rec.Topic != topic || r.orderKey == "" || !r.completed.IsZero() {
			continue
		}
		var p recordstore.Predecessor
		for _, eid := range s.order {
			if eid >= id {
				break
			}
			e := s.byID[eid]
			if e.rec.Topic != topic || e.orderKey != r.orderKey || !e.completed.IsZero() || (skipAbandoned && !e.abandoned.IsZero()) {
				continue
			}
			p = recordstore.Predecessor{ID: e.rec.ID, UUID: e.rec.UUID}
		}
		out[id] = p
	}
	return out, nil
}

// ClaimReplay implements [recordstore.ReplayClaimer].
func (s *Store) ClaimReplay(ctx context.Context, topic string, afterID int64, grace time.Duration, limit, maxBytes int) ([]recordstore.Record, error) {
	return s.claim(ctx, topic, nil, afterID, grace, limit, maxBytes, true)
}

// claim claims the pending, due records of topic after afterID last sent
// before olderThan ago, and with unsent those never sent after their
// publish, up to limit records or maxBytes (0: no budget); with a key, only
// the records of that order key.
func (s *Store) claim(ctx context.Context, topic string, key *string, afterID int64, olderThan time.Duration, limit, maxBytes int, unsent bool) ([]recordstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if olderThan <= 0 || limit < 1 {
		return nil, fmt.Errorf("%w: claiming stale records needs a positive age and limit (got %v, %d)", recordstore.ErrInvalidConfig, olderThan, limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	before := now.Add(-olderThan)
	var out []recordstore.Record
	bytes := 0
	for _, id := range s.order {
		if len(out) >= limit || (maxBytes > 0 && bytes >= maxBytes) {
			break
		}
		if id <= afterID {
			continue
		}
		r := s.byID[id]
		if key != nil && (r.rec.Topic != topic || r.orderKey != *key || !r.pending()) {
			continue
		}
		stale := r.sentAt().Before(before) || (unsent && r.lastSent.IsZero())
		if key != nil && (!stale || !r.due(now)) {
			// Only the head of the key after afterID is claimed.
			break
		}
		if r.rec.Topic != topic || !r.pending() || !stale || !r.due(now) {
			continue
		}
		if key == nil && !unsent && s.heldInKey(r) {
			// The stale resubmitter sends only the heads of keys.
			continue
		}
		r.lastSent = now
		out = append(out, copyRecord(r.rec))
		bytes += r.rec.Size()
	}
	return out, nil
}

// sentAt is when the record was last sent: by a claim, a stamp or a
// requeue, or else by the publish that saved it.
func (r *record) sentAt() time.Time {
	if r.lastSent.IsZero() {
		return r.created
	}
	return r.lastSent
}

// due reports whether the record, or one of its pending deliveries, is
// due.
func (r *record) due(now time.Time) bool {
	if r.deliveries == nil {
		return !r.attempt.due.After(now)
	}
	for _, dl := range r.deliveries {
		if dl.pending() && !dl.due.After(now) {
			return true
		}
	}
	return false
}

// StampSent implements [recordstore.SendStamper].
func (s *Store) StampSent(ctx context.Context, ids []int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, id := range ids {
		if r := s.byID[id]; r != nil {
			r.lastSent = now
		}
	}
	return nil
}

// Clean implements [recordstore.Cleaner]: it deletes completed records,
// oldest completion first; a store that deletes completed records has
// none to delete.
func (s *Store) Clean(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := checkClean(olderThan, limit); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	before := s.now().Add(-olderThan)
	var old []*record
	for _, r := range s.byID {
		if !r.completed.IsZero() && r.abandoned.IsZero() && r.completed.Before(before) {
			old = append(old, r)
		}
	}
	slices.SortFunc(old, func(a, b *record) int {
		return cmp.Or(a.completed.Compare(b.completed), cmp.Compare(a.rec.ID, b.rec.ID))
	})
	old = old[:min(limit, len(old))]
	for _, r := range old {
		s.remove(r.rec.ID)
	}
	return len(old), nil
}

// PendingStatus implements [recordstore.StatusReader].
func (s *Store) PendingStatus(ctx context.Context) ([]recordstore.TopicStatus, error) {
	return s.status(ctx, false)
}

// Status implements [recordstore.StatusReader]. The per-consumer Completed
// counts the deliveries the store holds: on a deleting store, those of
// records that other consumers have still to complete.
func (s *Store) Status(ctx context.Context) ([]recordstore.TopicStatus, error) {
	return s.status(ctx, true)
}

func (s *Store) status(ctx context.Context, full bool) ([]recordstore.TopicStatus, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	topics := map[string]*recordstore.TopicStatus{}
	consumers := map[string]map[string]*recordstore.ConsumerStatus{}
	oldest := func(age *time.Duration, created time.Time) { *age = max(*age, now.Sub(created)) }
	for _, id := range s.order {
		r := s.byID[id]
		if !full && !r.pending() {
			continue
		}
		t := topics[r.rec.Topic]
		if t == nil {
			t = &recordstore.TopicStatus{Topic: r.rec.Topic}
			topics[r.rec.Topic] = t
		}
		switch {
		case r.pending():
			t.Pending++
			oldest(&t.OldestPending, r.created)
		case !r.abandoned.IsZero():
			t.Abandoned++
		default:
			t.Completed++
		}
		for c, dl := range r.deliveries {
			if !full && !dl.pending() {
				continue
			}
			byConsumer := consumers[r.rec.Topic]
			if byConsumer == nil {
				byConsumer = map[string]*recordstore.ConsumerStatus{}
				consumers[r.rec.Topic] = byConsumer
			}
			cs := byConsumer[c]
			if cs == nil {
				cs = &recordstore.ConsumerStatus{Consumer: c}
				byConsumer[c] = cs
			}
			switch {
			case dl.pending():
				cs.Pending++
				oldest(&cs.OldestPending, r.created)
			case !dl.abandoned.IsZero():
				cs.Abandoned++
			default:
				cs.Completed++
			}
		}
	}
	for _, id := range s.order {
		if r := s.byID[id]; r.pending() && s.unchecked(r) {
			topics[r.rec.Topic].Unchecked++
		}
	}
	// A key is held when an abandoned record of it has pending ones after
	// it.
	abandonedKeys, held := map[[2]string]bool{}, map[[2]string]bool{}
	for _, id := range s.order {
		r := s.byID[id]
		k := [2]string{r.rec.Topic, r.orderKey}
		switch {
		case r.orderKey == "":
		case !r.abandoned.IsZero():
			abandonedKeys[k] = true
		case r.pending() && abandonedKeys[k] && !held[k]:
			held[k] = true
			topics[r.rec.Topic].HeldKeys++
		}
	}
	for topic := range s.seen {
		if topics[topic] == nil {
			topics[topic] = &recordstore.TopicStatus{Topic: topic}
		}
	}
	out := make([]recordstore.TopicStatus, 0, len(topics))
	for _, t := range topics {
		t.Seen, t.SinceSeen = s.topicSeen(t.Topic, now)
		for _, cs := range consumers[t.Topic] {
			if at, ok := s.seen[t.Topic][cs.Consumer]; ok {
				cs.Seen, cs.SinceSeen = true, now.Sub(at)
			} else {
				cs.Unchecked = cs.Pending
			}
			t.Consumers = append(t.Consumers, *cs)
		}
		slices.SortFunc(t.Consumers, func(a, b recordstore.ConsumerStatus) int { return cmp.Compare(a.Consumer, b.Consumer) })
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b recordstore.TopicStatus) int { return cmp.Compare(a.Topic, b.Topic) })
	return out, nil
}

// SawConsumer implements [recordstore.ConsumerRecorder]: it keeps when the
// consumer was last seen, by the store's clock.
func (s *Store) SawConsumer(ctx context.Context, topic, consumer string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[topic] == nil {
		s.seen[topic] = map[string]time.Time{}
	}
	s.seen[topic][consumer] = s.now()
	return nil
}

// unchecked reports whether a pending record waits for a consumer never
// seen (see [recordstore.TopicStatus.Unchecked]).
func (s *Store) unchecked(r *record) bool {
	if len(r.deliveries) == 0 {
		return len(s.seen[r.rec.Topic]) == 0
	}
	for c, dl := range r.deliveries {
		if _, ok := s.seen[r.rec.Topic][c]; !ok && dl.pending() {
			return true
		}
	}
	return false
}

// topicSeen reports whether a consumer of topic was seen, and how long ago
// the latest was.
func (s *Store) topicSeen(topic string, now time.Time) (bool, time.Duration) {
	var latest time.Time
	for _, at := range s.seen[topic] {
		if at.After(latest) {
			latest = at
		}
	}
	if latest.IsZero() {
		return false, 0
	}
	return true, now.Sub(latest)
}

// Retire implements [recordstore.ConsumerRetirer]: it completes the
// consumer's pending deliveries of the topic and rolls each record up.
func (s *Store) Retire(ctx context.Context, topic, consumer string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for _, id := range slices.Clone(s.order) {
		r := s.byID[id]
		if r.rec.Topic != topic {
			continue
		}
		if dl := r.deliveries[consumer]; dl != nil && dl.pending() {
			dl.completed = now
			dl.leaseUntil = time.Time{}
			s.rollUp(r, now)
			n++
		}
	}
	return n, nil
}

// checkClean refuses the arguments of a Clean, of records or of inbox
// entries, that clean nothing sensible.
func checkClean(olderThan time.Duration, limit int) error {
	if olderThan < 0 || limit < 1 {
		return fmt.Errorf("%w: cleaning needs a non-negative age and a positive limit (got %v, %d)", recordstore.ErrInvalidConfig, olderThan, limit)
	}
	return nil
}

// heldInKey reports whether an earlier record of r's order key is
// pending. The caller holds s.mu.
func (s *Store) heldInKey(r *record) bool {
	if r.orderKey == "" {
		return false
	}
	for _, id := range s.order {
		if id >= r.rec.ID {
			return false
		}
		if e := s.byID[id]; e.rec.Topic == r.rec.Topic && e.orderKey == r.orderKey && e.pending() {
			return true
		}
	}
	return false
}
