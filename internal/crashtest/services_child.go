package crashtest

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	// committed, by message UUID.
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
// batch of tracked messages (none in Drain mode), replays its pending
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
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: topic, Store: &haltingStore{Store: base, st: st},
		RemoteConsumers: []string{ConsumerB}, ConfirmTopic: confirmTopic})
	if err != nil {
		return err
	}
	rawPub, closePub, err := cfg.Publisher()
	if err != nil {
		return err
	}
	defer closePub()
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
		if err := publishBatch(pub, topic, st); err != nil {
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
	confirmPub, closePub, err := cfg.Publisher()
	if err != nil {
		return err
	}
	defer closePub()
	sub, err := cfg.Subscriber(ConsumerB)
	if err != nil {
		return fmt.Errorf("subscriber of %s: %w", ConsumerB, err)
	}
	router, err := newRouter(reg, outbox.MiddlewareConfig{Inbox: inbox, Confirmations: confirmPub}, childLogger())
	if err != nil {
		return err
	}
	insertEffect := cfg.DB.Rebind("INSERT INTO " + EffectsTable + " (uuid) VALUES (?)")
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
		if _, err := tx.ExecContext(ctx, insertEffect, msg.UUID); err != nil {
			return err
		}
		n := st.handles.Add(1) - 1
		if st.mode == MidHandler && n == st.at {
			halt(MidHandler)
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		if st.mode == AfterCommit && n == st.at {
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
