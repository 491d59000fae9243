package store

// List, Stat and Prune below a URL ("s3://bucket/prefix"): storage without directories or rename, where a checkpoint
// is the set of objects below a prefix, committed by writing its metadata last (FORMAT.md section 6.2). The library
// resolves the URL (distckpt.OpenStorageURL), lists the names below a prefix, says what is at each
// (StorageHandle.Stat: a committed checkpoint, only what unfinished saves left, or nothing distckpt wrote) and removes
// (RemoveCheckpoint, RemoveLeftovers, each judging anew); this file adds the listing order and Prune's plan.

import (
	"fmt"
	"sort"
	"strings"
	"time"

	distckpt "distckpt.dev/go"
)

// objectStore is the storage of a URL, opened once for a List, Stat or Prune so that its calls share connections.
type objectStore struct {
	h     *distckpt.StorageHandle
	url   string        // without a trailing '/'
	grace time.Duration // a prune's grace period
}

func openObjects(url string) (*objectStore, error) {
	scheme, _, _ := strings.Cut(url, "://")
	for len(url) > len(scheme)+len("://") && strings.HasSuffix(url, "/") {
		url = strings.TrimSuffix(url, "/")
	}
	h, err := distckpt.OpenStorageURL(url)
	if err != nil {
		return nil, err
	}
	return &objectStore{h: h, url: url}, nil
}

func (s *objectStore) close() { s.h.Close() }

// nothingAt is the error for a URL with nothing below it (object stores have no empty directories).
func nothingAt(url string) error {
	return &distckpt.Error{Code: distckpt.CodeNotFound, Message: fmt.Sprintf("%s: nothing there (no checkpoint and "+
		"no object below this prefix)", url)}
}

// describe makes the Checkpoint at path from what the library found there (info).
func (s *objectStore) describe(path string, info distckpt.PathInfo) *Checkpoint {
	c := &Checkpoint{Name: path[strings.LastIndex(path, "/")+1:], Path: path, DiskBytes: info.Bytes, Objects: &info}
	switch info.Kind {
	case distckpt.PathCheckpoint:
		readCommitted(c, s.h)
	case distckpt.PathIncomplete:
		c.Status, c.FinalName = Incomplete, c.Name
	default:
		c.Status = NotACheckpoint
	}
	return c
}

// children describes every name directly below the URL, in natural order; a child whose storage cannot be asked is
// Unreadable with its Err. The URL itself was found to hold no checkpoint (self).
func (s *objectStore) children(self distckpt.PathInfo, grace time.Duration) ([]*Checkpoint, error) {
	names, err := s.h.List(s.url)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 && self.Kind == distckpt.PathNone {
		return nil, nothingAt(s.url)
	}
	var out []*Checkpoint
	for _, n := range names {
		path := s.url + "/" + n
		info, err := s.h.Stat(path, grace)
		if err != nil {
			out = append(out, &Checkpoint{Name: n, Path: path, Status: Unreadable, Err: err})
			continue
		}
		out = append(out, s.describe(path, info))
	}
	sort.Slice(out, func(i, j int) bool { return naturalLess(out[i].Name, out[j].Name) })
	return out, nil
}

func listObjects(url string, o ListOptions) ([]Checkpoint, error) {
	s, err := openObjects(url)
	if err != nil {
		return nil, err
	}
	defer s.close()
	self, err := s.h.Stat(s.url, DefaultGrace)
	if err != nil {
		return nil, err
	}
	if self.Kind != distckpt.PathNone {
		// A checkpoint, or what unfinished saves left at the URL itself: that one, as for a directory with a
		// metadata file or a STAGING marker.
		return []Checkpoint{*s.describe(s.url, self)}, nil
	}
	all, err := s.children(self, DefaultGrace)
	if err != nil {
		return nil, err
	}
	return listed(all, o.All), nil
}

func statObject(url string) (*Checkpoint, error) {
	s, err := openObjects(url)
	if err != nil {
		return nil, err
	}
	defer s.close()
	info, err := s.h.Stat(s.url, DefaultGrace)
	if err != nil {
		return nil, err
	}
	if info.Kind == distckpt.PathNone {
		names, err := s.h.List(s.url)
		if err != nil {
			return nil, err
		}
		if len(names) == 0 {
			return nil, nothingAt(s.url)
		}
	}
	return s.describe(s.url, info), nil
}

// forPrune describes what is below the URL with the prune's grace period; a URL that is itself a checkpoint is
// refused, as a directory holding a metadata file is.
func (s *objectStore) forPrune(grace time.Duration) ([]*Checkpoint, error) {
	s.grace = grace
	self, err := s.h.Stat(s.url, grace)
	if err != nil {
		return nil, err
	}
	if self.Kind == distckpt.PathCheckpoint {
		return nil, &distckpt.Error{Code: distckpt.CodeInvalid, Message: fmt.Sprintf("'%s' is a checkpoint; prune "+
			"takes the prefix that holds checkpoints", s.url)}
	}
	return s.children(self, grace)
}

// objectGarbage is Prune's judgement of a child of a URL before the policy's: what unfinished saves left is removed
// when no save there is in progress (every marker stale), a prefix with a save in progress is kept whole, and a
// committed checkpoint with one is pinned (an overwrite may be committing over it). Other children are not Prune's.
func objectGarbage(c *Checkpoint, grace time.Duration, keep, del func(*Checkpoint, string), pinned map[string]string) {
	o := c.Objects
	switch c.Status {
	case Incomplete:
		if o.SavesInProgress > 0 {
			keep(c, fmt.Sprintf("%d save(s) in progress (a writer marker younger than %s, or of a live process of "+
				"this host)", o.SavesInProgress, HumanDuration(grace)))
		} else {
			del(c, fmt.Sprintf("leftovers of unfinished saves (%d file(s)) whose writers are gone or started more "+
				"than %s ago", o.LeftoverFiles, HumanDuration(grace)))
		}
	case Committed:
		if o.SavesInProgress > 0 {
			pinned[c.Name] = "a save is in progress at it (an overwrite may be committing over it)"
		}
	case Corrupt, Unreadable:
		keep(c, "metadata cannot be read: not touched (check it with ls/inspect)")
	}
}

// objectLeftoversBeside is the removal of what other saves left beside the kept committed checkpoint c below a URL
// (files of superseded or unfinished saves), nil when there is none or a save there is in progress.
func objectLeftoversBeside(c *Checkpoint, grace time.Duration) *PruneAction {
	o := c.Objects
	if o == nil || o.LeftoverFiles == 0 || o.SavesInProgress > 0 {
		return nil
	}
	g := *c
	g.Status, g.DiskBytes, g.Info, g.User = Incomplete, o.LeftoverBytes, nil, nil
	return &PruneAction{Checkpoint: g, Action: Delete, Reason: fmt.Sprintf("%d file(s) of superseded or unfinished "+
		"saves beside the kept checkpoint (writers gone or started more than %s ago)", o.LeftoverFiles,
		HumanDuration(grace))}
}

// removeCheckpoint removes a committed checkpoint Prune decided to delete, if it still is one with no save in progress
// (a save may have started there since the listing): metadata first, then its data files, never a foreign object.
func (s *objectStore) removeCheckpoint(c *Checkpoint) error {
	info, err := s.h.Stat(c.Path, s.grace)
	if err != nil {
		return err
	}
	switch {
	case info.Kind == distckpt.PathNone:
		return nil // someone else removed it first
	case info.Kind != distckpt.PathCheckpoint || info.SavesInProgress > 0:
		return &distckpt.Error{Code: distckpt.CodeState, Message: fmt.Sprintf("'%s' changed since the store was "+
			"listed (a save is in progress there): not deleted", c.Path)}
	}
	return s.h.RemoveCheckpoint(c.Path)
}

// removeLeftovers removes what unfinished or superseded saves left at c's prefix; the library judges every marker
// anew against the grace period and never removes a committed checkpoint's files or a foreign object.
func (s *objectStore) removeLeftovers(c *Checkpoint, grace time.Duration) error {
	return s.h.RemoveLeftovers(c.Path, grace, false, nil)
}
