package crashtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// The two services of [RunServices]: A publishes a tracked topic whose
// receiver is B's handler, and B, with a database of its own, confirms each
// handling over the broker.
const (
	// ConsumerB is B's handler of A's tracked topic, A's remote consumer.
	ConsumerB = "b_handler"
	// ConfirmGroup is the consumer name A subscribes to its confirmation
	// topic with: on RabbitMQ, the suffix of its queue.
	ConfirmGroup = "a_confirm"
	// EffectsTable is B's table of effects: one row per handling that
	// committed, by message UUID, with its message's order key and its
	// position among that key's effects, written in the same transaction.
	EffectsTable = "b_effects"
	// InboxTable is B's inbox.
	InboxTable = "b_inbox"
)

// Topics returns A's tracked topic and its confirmation topic, named after
// A's record table.
func Topics(table string) (topic, confirmTopic string) {
	return "crash_" + table, "crash_" + table + "_confirm"
}

// staleAfter is how long A's records may wait for their confirmation before
// A's stale resubmitter sends them again: short, so that a send lost in a
// kill (the AMQP publisher does not wait for the broker's confirm) is
// recovered while A runs, not only at its next start.
const staleAfter = 2 * time.Second

// ServiceA runs service A until it is killed: it tracks
// [Topics](table) with B's handler as its remote consumer, publishes a
// batch of tracked messages (none in Drain mode; in an ordered run, one
// every publishEvery with a random key, ordered by key, until it is
// killed), replays its pending
// records at start, resends stale ones, and completes B's deliveries from
// B's confirmations. cfg.Subscriber is called with [ConfirmGroup]. Kill
// points: [AfterInsert], [BeforeMark] (a confirmation received, its
// completion not yet written) and [Random]. It never returns.
func ServiceA(cfg ChildConfig) { exit(serviceA(cfg)) }

// ServiceB runs service B until it is killed: its handler [ConsumerB] of
// A's tracked topic writes its effect row into [EffectsTable] and the inbox
// entry ([InboxTable]) in one transaction ([outbox.InboxTx]), and its
// middleware confirms each handling to A through cfg.Publisher. Kill
// points: [MidHandler] (inside the transaction), [AfterCommit] and
// [Random]. It never returns.
func ServiceB(cfg ChildConfig) { exit(serviceB(cfg)) }

func serviceA(cfg ChildConfig) error {
	st := stateFromEnv()
	topic, confirmTopic := Topics(os.Getenv(envTable))
	base, err := sqlstore.New(sqlstore.Config{Dialect: cfg.Dialect, Table: os.Getenv(envTable), DB: cfg.DB, Completion: recordsMode})
	if err != nil {
		return err
	}
	tracked := outbox.Tracked{Topic: topic, Store: &haltingStore{Store: base, st: st},
		RemoteConsumers: []string{ConsumerB}, ConfirmTopic: confirmTopic}
	if st.keys > 0 {
		tracked.OrderKey = orderKey
	}
	reg, err := outbox.NewRegistry(tracked)
	if err != nil {
		return err
	}
	pub, closePub, err := cfg.Publisher()
	if err != nil {
		return err
	}
	defer closePub()
	rawPub := &countingPublisher{Publisher: pub, count: countSend}
	confirmations, err := cfg.Subscriber(ConfirmGroup)
	if err != nil {
		return fmt.Errorf("subscriber of %s: %w", ConfirmGroup, err)
	}
	logger := childLogger()
	resubmitter, err := outbox.NewStaleResubmitter(reg, rawPub, outbox.StaleResubmitterConfig{OlderThan: staleAfter, Interval: staleAfter / 4}, logger)
	if err != nil {
		return err
	}
	router, err := newRouter(reg, outbox.MiddlewareConfig{}, logger)
	if err != nil {
		return err
	}
	// The replay by claims with A's own short window, beside its resubmitter.
	router.AddPlugin(outbox.ReplayPlugin(reg, rawPub, outbox.ReplayConfig{ClaimGrace: staleAfter, NoResubmit: true}, logger), resubmitter.Plugin())
	if err := outbox.AddConfirmationHandler(router, reg, confirmations, logger); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr, err := runRouter(ctx, router)
	if err != nil {
		return err
	}
	fmt.Println("READY")
	if st.mode != Drain {
		pub, err := outbox.NewPublisher(reg, &haltingPublisher{Publisher: rawPub, st: st})
		if err != nil {
			return err
		}
		if st.keys > 0 {
			published := make(chan error, 1)
			go func() { published <- publishUntilKilled(pub, topic, st) }()
			select {
			case err := <-published:
				return err
			case err := <-runErr:
				return fmt.Errorf("router stopped: %v", err)
			}
		} else if err := publishBatch(pub, topic, st); err != nil {
			return err
		}
	}
	return fmt.Errorf("router stopped: %v", <-runErr) // it runs until the kill
}

func serviceB(cfg ChildConfig) error {
	st := stateFromEnv()
	topic, _ := Topics(os.Getenv(envTable))
	inbox, err := sqlstore.NewInbox(sqlstore.InboxConfig{Dialect: cfg.Dialect, DB: cfg.DB, Table: InboxTable})
	if err != nil {
		return err
	}
	reg, err := outbox.NewRegistry() // B tracks nothing of its own
	if err != nil {
		return err
	}
	pub, closePub, err := cfg.Publisher()
	if err != nil {
		return err
	}
	defer closePub()
	confirmPub := &countingPublisher{Publisher: pub, count: countConfirmation}
	sub, err := cfg.Subscriber(ConsumerB)
	if err != nil {
		return fmt.Errorf("subscriber of %s: %w", ConsumerB, err)
	}
	router, err := newRouter(reg, outbox.MiddlewareConfig{Inbox: inbox, Confirmations: confirmPub}, childLogger())
	if err != nil {
		return err
	}
	insertEffect := cfg.DB.Rebind("INSERT INTO " + EffectsTable + " (uuid, k, pos) SELECT ?, ?, COUNT(*) FROM " + EffectsTable + " WHERE k = ?")
	router.AddNoPublisherHandler(ConsumerB, topic, sub, func(msg *message.Message) error {
		ctx := msg.Context()
		tx, err := cfg.DB.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		switch err := outbox.InboxTx(ctx, tx, msg); {
		case errors.Is(err, outbox.ErrAlreadyHandled):
			return nil // another copy did it
		case err != nil:
			return err
		}
		key := msg.Metadata.Get(orderKey)
		if _, err := tx.ExecContext(ctx, insertEffect, msg.UUID, key, key); err != nil {
			return err
		}
		n := st.handles.Add(1) - 1
		if st.haltsAt(MidHandler, n) {
			halt(MidHandler)
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		if st.haltsAt(AfterCommit, n) {
			halt(AfterCommit)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr, err := runRouter(ctx, router)
	if err != nil {
		return err
	}
	fmt.Println("READY")
	return fmt.Errorf("router stopped: %v", <-runErr) // it runs until the kill
}

// childLogger logs a service's errors and infos to stderr, whose tail the
// parent shows when a child fails.
func childLogger() watermill.LoggerAdapter {
	return watermill.NewStdLoggerWithOut(os.Stderr, false, false)
}

// publishEvery spaces the publishes of A in an ordered run, each of one
// to maxBurst messages (50 a second): about as many as B's instances
// handle in order, holding and confirming, so that the backlog a kill
// leaves is worked off while the run goes on.
const (
	publishEvery = 50 * time.Millisecond
	maxBurst     = 4
)

// publishUntilKilled publishes, every publishEvery, a burst of messages
// that the broker brings B's instances back to back; each message has the
// key of the one before or, half of the time, one of st.keys drawn at
// random, so that a key's messages often come together, and two instances
// of B get two of them at once. It returns only on a failed publish.
func publishUntilKilled(pub message.Publisher, topic string, st *childState) error {
	rng := rand.New(rand.NewPCG(uint64(st.cycle), 0x5eed))
	tick := time.NewTicker(publishEvery)
	defer tick.Stop()
	key := 0
	for i := 0; ; {
		msgs := make([]*message.Message, 1+rng.IntN(maxBurst))
		for j := range msgs {
			if rng.IntN(2) == 0 {
				key = rng.IntN(st.keys)
			}
			msgs[j] = message.NewMessage(uuidOf(st.cycle, i), []byte(strconv.Itoa(i)))
			msgs[j].Metadata.Set(orderKey, fmt.Sprintf("k%02d", key))
			i++
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		<-tick.C
	}
}

// countingPublisher tells the parent of each message it sends, as count
// names it ("" for none), on a [countLine]: a line is written before the
// message goes, so a kill can count a send that never left.
type countingPublisher struct {
	message.Publisher
	count func(*message.Message) string
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		if what := p.count(msg); what != "" {
			fmt.Println(countLine + what)
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

// The events of an ordered run that the summary counts
// ([ServicesSummary.Events]).
const (
	// EventSend is a send of a tracked message by A: a first send, a
	// replay, a resend of a stale record or of a held one.
	EventSend = "A/send"
	// EventReleased is a send by A of a message released for B: held by
	// B, and no earlier record of its key holds it at A.
	EventReleased = "A/send-released"
	// EventConfirmation is a confirmation B sends of a handled message.
	EventConfirmation = "B/confirm"
	// EventHeld is a confirmation B sends of a held message: its key's
	// earlier message is not in B's inbox.
	EventHeld = "B/held"
)

func countSend(msg *message.Message) string {
	if msg.Metadata.Get(outbox.MetadataReleasedFor) != "" {
		return EventReleased
	}
	return EventSend
}

// countConfirmation tells a held confirmation from the others by its
// held_id field, the one part of the confirmation's wire format the
// harness reads.
func countConfirmation(msg *message.Message) string {
	var c struct {
		HeldID int64 `json:"held_id"`
	}
	if json.Unmarshal(msg.Payload, &c) == nil && c.HeldID != 0 {
		return EventHeld
	}
	return EventConfirmation
}
