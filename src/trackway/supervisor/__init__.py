"""The supervisor: launches attempts, notices their ends, classifies them and records the receipts."""
