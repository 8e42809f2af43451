package main

import (
	"context"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox"
	"github.com/wmoutbox/outbox/sqlstore"
)

// discard is a publisher that sends nowhere, so that a publish case measures
// what the outbox adds: the insert.
type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

func benchMessage() *message.Message {
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set(sentKey, strconv.FormatInt(time.Now().UnixNano(), 10))
	return m
}

// trackedPublish is writers goroutines publishing tracked messages, perCall
// per Publish, through the decorator.
func trackedPublish(ctx context.Context, d *database, writers, perCall int, co sqlstore.Coalescing, dur time.Duration) (result, error) {
	store, err := d.newStore(ctx, co)
	if err != nil {
		return result{}, err
	}
	defer d.drop(ctx, store)
	reg, err := outbox.NewRegistry(outbox.Tracked{Topic: "bench", Store: store})
	if err != nil {
		return result{}, err
	}
	pub, err := outbox.NewPublisher(reg, discard{})
	if err != nil {
		return result{}, err
	}
	res := loop(ctx, writers, dur, func(context.Context, int) (int, error) {
		msgs := make([]*message.Message, perCall)
		for i := range msgs {
			msgs[i] = benchMessage()
		}
		return perCall, pub.Publish("bench", msgs...)
	})
	return res, errorsOf("tracked publish", res)
}
