package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

func (c *cli) status(ctx context.Context, s *sqlstore.Store) error {
	sts, err := s.Status(ctx)
	if err != nil {
		return err
	}
	if c.json {
		if sts == nil {
			sts = []recordstore.TopicStatus{} // "topics": [], not null
		}
		return c.printJSON(statusJSON{Table: s.Table(), Completion: s.Completion().String(), Topics: sts})
	}
	err = c.printTable("TOPIC\tPENDING\tOLDEST PENDING\tABANDONED\tCOMPLETED\tUNCHECKED\tHELD KEYS\tLAST SEEN", func(w io.Writer) {
		for _, st := range sts {
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%s\n", st.Topic, st.Pending, age(st.OldestPending), st.Abandoned, st.Completed, st.Unchecked, st.HeldKeys, lastSeen(st.Seen, st.SinceSeen))
		}
	})
	if err != nil || !hasRemote(sts) {
		return err
	}
	fmt.Fprintln(c.out)
	return c.printTable("REMOTE CONSUMER\tTOPIC\tAWAITING CONFIRMATION\tOLDEST\tLAST SEEN", func(w io.Writer) {
		for _, st := range sts {
			for _, cs := range st.Consumers {
				if cs.Remote {
					fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", cs.Consumer, st.Topic, cs.Pending, age(cs.OldestPending), lastSeen(cs.Seen, cs.SinceSeen))
				}
			}
		}
	})
}

// hasRemote reports whether a topic of the status has a remote consumer,
// which status lists with its deliveries awaiting confirmation.
func hasRemote(sts []recordstore.TopicStatus) bool {
	for _, st := range sts {
		for _, cs := range st.Consumers {
			if cs.Remote {
				return true
			}
		}
	}
	return false
}

// listBytes bounds what one page of list holds in payloads and metadata.
const listBytes = 16 << 20

func pageBytes(infos []recordstore.RecordInfo) int {
	n := 0
	for i := range infos {
		n += infos[i].Size()
	}
	return n
}

func (c *cli) list(ctx context.Context, s *sqlstore.Store) error {
	// One more tells whether there are more; a page of large payloads
	// stops at listBytes, and then there may be more too.
	infos, err := s.Operator().List(ctx, sqlstore.RecordFilter{State: sqlstore.State(c.state)}, c.after, c.limit+1, listBytes)
	if err != nil {
		return err
	}
	more := len(infos) > c.limit || pageBytes(infos) >= listBytes
	if len(infos) > c.limit {
		infos = infos[:c.limit]
	}
	var next int64
	if more {
		next = infos[len(infos)-1].ID
	}
	if c.json {
		out := listJSON{Records: make([]recordJSON, len(infos)), More: more, NextAfter: next}
		for i, r := range infos {
			out.Records[i] = toJSON(r, false)
		}
		return c.printJSON(out)
	}
	err = c.printTable("ID\tTOPIC\tUUID\tSTATE\tATTEMPTS\tAGE\tRESENT\tCONSUMERS\tLAST ERROR", func(w io.Writer) {
		for _, r := range infos {
			attempts, lastError := attemptsAndError(r)
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.Topic, r.UUID, r.State, attempts, age(r.Age), resent(r),
				deliveriesLine(r.Deliveries), oneLine(lastError, 60))
		}
	})
	if err == nil && more {
		fmt.Fprintf(c.errOut, "… more: use -after %d\n", next)
	}
	return err
}

func (c *cli) show(ctx context.Context, s *sqlstore.Store) error {
	ids, err := parseIDs(c.args, 1)
	if err != nil {
		return err
	}
	r, err := s.Operator().Get(ctx, ids[0])
	if err != nil {
		return err
	}
	j := toJSON(r, true)
	if c.json {
		return c.printJSON(j)
	}
	metadata, err := json.Marshal(r.Metadata)
	if err != nil {
		return err
	}
	if r.Metadata == nil {
		metadata = []byte("{}")
	}
	payload := j.Payload
	if j.PayloadIsBase64 {
		payload += " (base64)"
	}
	fmt.Fprintf(c.out, "id:         %d\ntopic:      %s\nuuid:       %s\nstate:      %s\nattempts:   %d\nage:        %s\nlast sent:  %s\nlast error: %s\nmetadata:   %s\npayload:    %s\n",
		r.ID, r.Topic, r.UUID, r.State, r.Attempts, age(r.Age), lastSent(r), oneLine(r.LastError, 1000), metadata, payload)
	for _, d := range r.Deliveries {
		fmt.Fprintf(c.out, "consumer:   %s: %s, %d attempt(s)", d.Consumer, d.State, d.Attempts)
		if d.LastError != "" {
			fmt.Fprintf(c.out, ", last error: %s", oneLine(d.LastError, 200))
		}
		fmt.Fprintln(c.out)
	}
	return nil
}
