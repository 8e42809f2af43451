// Package hooks hands the operator's package (outboxops) what the outbox's
// registry runs for it, without the root package exporting it: package
// outbox sets each hook when it is initialized.
package hooks

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
)

// RunWithRouter returns a router plugin that runs run while the router
// runs, counted among the loops of reg (an *outbox.Registry), whose
// WaitCompletions waits for it once the router closes.
var RunWithRouter func(reg any, run func(ctx context.Context) error) message.RouterPlugin

// Requeue makes the abandoned record id of topic, tracked by reg (an
// *outbox.Registry), pending again and sends it through pub.
var Requeue func(ctx context.Context, reg any, pub message.Publisher, topic string, id int64) error
