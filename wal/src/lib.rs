//! quire-wal: the write-ahead log of one store. (Being built; see issue "Step 1".)
