package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmoutbox/outbox/recordstore"
	"github.com/wmoutbox/outbox/sqlstore"
)

// TestFillWritesWhatTheStoreWrites fills a table on each database and checks
// that the store reads the generated records as it reads its own: a
// completed one has the columns of a record the store completed, is
// completed a day ago, and the Cleaner deletes it; a pending one is what
// replay reads.
func TestFillWritesWhatTheStoreWrites(t *testing.T) {
	for _, name := range []string{"postgres", "mariadb", "sqlite"} {
		t.Run(name, func(t *testing.T) {
			d := benchDatabase(t, name)
			ctx := t.Context()
			s, err := d.newStoreOf(ctx, sqlstore.Coalescing{}, sqlstore.Mark)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.drop(context.Background(), s) })

			// A record published and completed through the store, as the
			// end-to-end cases' handler of topic bench_0 completes it.
			own := []recordstore.Record{{Topic: "bench_0", UUID: "own", Payload: payload, Metadata: message.Metadata{publisherKey: "0"}}}
			if err := s.Insert(ctx, own); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, recordstore.Delivery{ID: own[0].ID, Topic: "bench_0", Consumer: "bench_0"}); err != nil {
				t.Fatal(err)
			}
			const rows = 10
			if err := fillTable(ctx, d, s, fill{rows: rows, topics: topics(2), completed: true}); err != nil {
				t.Fatal(err)
			}
			ownRow := rowByID(t, d, s, own[0].ID)
			filledRow := rowByID(t, d, s, own[0].ID+1)
			for col, want := range ownRow {
				got, ok := filledRow[col]
				switch {
				case !ok:
					t.Errorf("the filled row has no column %s", col)
				case (want == nil) != (got == nil):
					t.Errorf("column %s: the store wrote %v, the fill %v", col, want, got)
				case col == "id" || col == "uuid" || col == "metadata" || col == "created_at" || col == "processed_at":
				case fmt.Sprint(want) != fmt.Sprint(got):
					t.Errorf("column %s: the store wrote %v, the fill %v", col, want, got)
				}
			}
			info, err := s.Operator().Get(ctx, own[0].ID+1)
			if err != nil {
				t.Fatal(err)
			}
			if info.State != sqlstore.Completed || info.Age < 24*time.Hour {
				t.Errorf("a filled record is %v, saved %v ago; want completed, a day ago or more", info.State, info.Age)
			}
			st, err := s.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			completed := map[string]int64{}
			for _, ts := range st {
				if ts.Pending != 0 {
					t.Errorf("topic %s has %d pending records after a fill of completed ones", ts.Topic, ts.Pending)
				}
				completed[ts.Topic] = ts.Completed
			}
			if completed["bench_0"] != 1+rows/2 || completed["bench_1"] != rows/2 {
				t.Errorf("completed records by topic: %v; want bench_0 %d, bench_1 %d", completed, 1+rows/2, rows/2)
			}
			cleaned, err := s.Clean(ctx, fillOlderThan, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if cleaned != rows {
				t.Errorf("the cleaner deleted %d records; want the %d filled ones, not the one completed now", cleaned, rows)
			}

			if err := fillTable(ctx, d, s, fill{rows: 7, topics: []string{"replay"}}); err != nil {
				t.Fatal(err)
			}
			pending, err := s.PendingAfter(ctx, "replay", 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(pending) != 7 {
				t.Fatalf("replay reads %d pending records; want 7", len(pending))
			}
			if pending[0].Metadata.Get(publisherKey) != "0" || string(pending[0].Payload) != string(payload) {
				t.Errorf("replay reads %+v; want the fill's payload and metadata", pending[0])
			}
		})
	}
}

// rowByID reads every column of one record.
func rowByID(t *testing.T, d *database, s *sqlstore.Store, id int64) map[string]any {
	t.Helper()
	row := map[string]any{}
	if err := d.db.QueryRowx(d.db.Rebind("SELECT * FROM "+s.Table()+" WHERE id = ?"), id).MapScan(row); err != nil {
		t.Fatalf("record %d: %v", id, err)
	}
	return row
}
